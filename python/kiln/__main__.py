"""python -m kiln: what kiln runs on (kiln.show_config()); --clear-cache empties the compile cache."""
import argparse
import sys

from . import config


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kiln", description=__doc__)
    p.add_argument("--clear-cache", action="store_true",
                   help="delete the compiled kernels cached on disk ($KILN_CACHE_DIR, default ~/.cache/kiln)")
    args = p.parse_args(argv)
    if args.clear_cache:
        try:
            entries, size = config.clear_cache()
        except RuntimeError as e:
            print(f"python -m kiln: {e}", file=sys.stderr)
            return 1
        print(f"compile cache: deleted {config.plural(entries, 'entry', 'entries')} ({config.size_text(size)})")
        return 0
    config.show_config()
    return 0


if __name__ == "__main__":
    sys.exit(main())
