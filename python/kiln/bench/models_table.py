"""`python -m kiln.bench --models`: the model zoo's table (bench/bench_zoo.py, over the models in
examples/) after the tutorial's tables. The zoo lives in the source tree, not in the package: an
installed kiln without its checkout says so instead."""
import pathlib
import runpy
import sys


def zoo_script():
    """bench/bench_zoo.py of the checkout kiln runs from, or None."""
    root = pathlib.Path(__file__).resolve().parents[3]
    script = root / "bench" / "bench_zoo.py"
    return script if script.is_file() and (root / "examples").is_dir() else None


def run(quick):
    script = zoo_script()
    print("\nkiln.bench --models: the model zoo (examples/) against PyTorch where installed")
    if script is None:
        print("the model zoo's table needs kiln's source checkout (bench/bench_zoo.py, examples/)")
        return 1
    argv = sys.argv
    sys.argv = [str(script)] + (["--quick"] if quick else [])
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    return 0
