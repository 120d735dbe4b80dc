"""ast capture of a block that writes through a global or closed-over container (G[k] = v,
cache[key] = v inside an if, a while or a for): the converted block must mutate that object, not
rebind the name (which made it a local of the converted function: UnboundLocalError at the first
call). Each case runs eagerly and under every kiln.jit variant, the containers observed."""
from conformance import Call, rand, run_all_modes

STATS = {"calls": 0, "big": 0}
MEMO = {}


def counts_calls(x):
    if x.shape[0] > 2:
        STATS["big"] += 1
    STATS["calls"] += 1
    return x * 2.0


def test_global_counter_written_inside_an_if():
    run_all_modes(counts_calls, (rand(3),), (rand(2),), (rand(4),),
                  reset=lambda: STATS.update(calls=0, big=0), observe=lambda: dict(STATS))


def memo_by_shape(x):
    key = tuple(x.shape)
    if key not in MEMO:
        MEMO[key] = float(len(MEMO) + 1)
    return x + MEMO[key]


def test_global_memo_filled_inside_an_if():
    run_all_modes(memo_by_shape, (rand(2),), (rand(3),), (rand(2, seed=1),),
                  reset=MEMO.clear, observe=lambda: dict(MEMO))


def make_histogram():
    bins = [0, 0, 0]

    def histogram(x, n):
        for i in range(n):
            bins[i % 3] += 1
        k = 0
        while k < n:
            bins[0] += 2
            k += 1
        return x.sum() + float(n)
    return histogram, bins


HIST, BINS = make_histogram()


def test_closed_over_list_written_inside_for_and_while():
    run_all_modes(HIST, (rand(3), 2), (rand(3), 4), Call((rand(3, seed=2), 1)),
                  reset=lambda: BINS.__setitem__(slice(None), [0, 0, 0]), observe=lambda: list(BINS))


def rebinds_and_writes(x):
    table = {"a": 1.0}
    if x.shape[0] > 1:
        table["a"] = 3.0
        table = dict(table, b=2.0)
    return x * table["a"] + table.get("b", 0.0)


def test_local_container_rebound_and_written_inside_an_if():
    run_all_modes(rebinds_and_writes, (rand(1),), (rand(3),))
