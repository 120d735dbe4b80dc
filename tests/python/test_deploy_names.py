"""trace.dump's names (keep_var_name, keep_param_name, keep_opr_name, keep_opr_priority) and
append=True: what each option stores, what survives the inference rewrites, files of several
graphs, version 1 files, and corrupt names sections (docs/model_format.md)."""
import inspect
import io
import os
import struct
import subprocess

import numpy as np
import pytest

import kiln
from kiln import models
from test_deploy import CNN, KILN_RUN, MLP, arr, basic_block, dumped, fix_checksum, traced

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL = dict(keep_var_name=2, keep_opr_name=True, keep_param_name=True, keep_opr_priority=True)


def loaded(t, **options):
    return kiln.load(dumped(t, **options)[0])


def test_dump_keeps_seed_004s_signature():
    params = inspect.signature(kiln.trace.dump).parameters
    assert list(params)[:4] == ["self", "file", "arg_names", "output_names"]
    assert params["append"].default is False and params["optimize_for_inference"].default is True
    assert params["keep_var_name"].default == 1 and params["keep_param_name"].default is False
    assert list(params)[-1] == "kwargs"


def test_each_keep_option_changes_what_is_stored():
    x = arr(4, 6)
    t, _ = traced(MLP(), x)
    raw = dict(optimize_for_inference=False)
    none = loaded(t, keep_var_name=0, **raw)
    assert (none.param_names, none.var_names, none.op_names, none.op_priorities) == ([], [], [], [])
    user = loaded(t, arg_names=["data"], output_names=["scores"], **raw)  # keep_var_name=1: the user's names
    assert user.var_names == ["data", "scores"] and user.param_names == [] and user.op_names == []
    params = loaded(t, keep_var_name=0, keep_param_name=True, **raw)
    assert params.param_names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"] and params.var_names == []
    every = loaded(t, arg_names=["data"], **ALL, **raw)
    n = every.num_nodes
    assert len(every.op_names) == n and every.op_priorities == list(range(1, n + 1))
    # "<op>(<first input's name>)[<position>]"; generated value names "<op><position>", the output
    # keeping the user's name
    assert every.op_names == ["linear(data)[0]", "relu(linear0)[1]", "linear(relu1)[2]"]
    assert every.var_names == ["data", "linear0", "relu1", "output"]
    # a generated name the user gave a value already gets a "'"
    clash = loaded(t, arg_names=["relu1"], keep_var_name=2, **raw)
    assert clash.var_names == ["relu1", "linear0", "relu1'", "output"]
    ops_only = loaded(t, keep_var_name=0, keep_opr_name=True, **raw)
    assert len(ops_only.op_names) == n and ops_only.op_priorities == [] and ops_only.var_names == []
    prio = loaded(t, keep_var_name=0, keep_opr_priority=True, **raw)
    assert prio.op_priorities == list(range(1, n + 1)) and prio.op_names == []
    # the same options give the same bytes; different ones different bytes
    assert dumped(t, **ALL, **raw)[0] == dumped(t, **ALL, **raw)[0]
    assert dumped(t, **ALL, **raw)[0] != dumped(t, **raw)[0]


def test_names_through_the_inference_rewrites():
    blk = basic_block()
    x = arr(1, 8, 10, 10)
    t, want = traced(blk, x)
    raw = loaded(t, optimize_for_inference=False, **ALL)
    assert raw.param_names[:2] == ["conv1.weight", "bn1.gamma"]
    assert len(raw.op_names) == raw.num_nodes == 7
    fused = loaded(t, enable_fuse_conv_bias_with_z=True, **ALL)
    np.testing.assert_allclose(fused(x).asnumpy(), want.asnumpy(), rtol=1e-4, atol=1e-5)
    # two fused convolutions, each named after its convolution; batch norm, relu and add are gone
    assert fused.op_names == [raw.op_names[0], raw.op_names[3]]
    assert fused.op_priorities == [1, 4]
    assert not any(name.startswith(("batch_norm", "add")) for name in fused.op_names)
    # the folded weights are new tensors: their parameter names are dropped
    assert fused.param_names == []
    # priorities keep the recorded order of the ops that remain
    plain = loaded(t, **ALL)
    prios = [p for p in plain.op_priorities if p]
    assert prios == sorted(prios) and len(set(prios)) == len(prios)
    # the MLP's parameters survive the rewrites with their names
    mlp = loaded(traced(MLP(), arr(4, 6))[0], keep_param_name=True)
    assert mlp.param_names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def test_append_two_graphs_and_load_each(tmp_path):
    path = tmp_path / "two.kiln"
    x = arr(4, 6)
    t1, want1 = traced(MLP(), x)
    t1.dump(str(path), **ALL)
    c = arr(2, 3, 8, 8)
    cnn = CNN().set_train(False)
    t2, _ = traced(cnn, c)
    t2.dump(str(path), append=True, graph_name="cnn", keep_opr_name=True)
    first, second = kiln.load(str(path)), kiln.load(str(path), index=1)
    assert first.graph_names == second.graph_names == ["MLP", "cnn"]
    assert (first.name, first.index, second.name, second.index) == ("MLP", 0, "cnn", 1)
    np.testing.assert_allclose(first(x).asnumpy(), MLP.construct(t1.__wrapped__, x).asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second(c).asnumpy(), cnn(c).asnumpy(), rtol=1e-4, atol=1e-5)
    assert len(first.op_names) == first.num_nodes and second.param_names == []
    by_name = kiln.load(str(path), name="cnn")
    assert by_name.index == 1
    np.testing.assert_array_equal(by_name(c).asnumpy(), second(c).asnumpy())
    # each graph is a record of its own: the file is the two dumps one after the other
    alone = io.BytesIO()
    t2.dump(alone, graph_name="cnn", keep_opr_name=True)
    assert path.read_bytes().endswith(alone.getvalue())
    # the default name of a second graph of the same function gets its position
    t1.dump(str(path), append=True)
    t1.dump(str(path), append=True, graph_name="MLP:3")
    t1.dump(str(path), append=True)
    assert kiln.load(str(path)).graph_names == ["MLP", "cnn", "MLP:2", "MLP:3", "MLP:4"]
    with pytest.raises(ValueError, match="already holds a graph named 'cnn'"):
        t2.dump(str(path), append=True, graph_name="cnn")
    with pytest.raises(ValueError, match="no graph 5 \\(the file holds 5\\)"):
        kiln.load(str(path), index=5)
    with pytest.raises(ValueError, match="no graph named 'nope'"):
        kiln.load(str(path), name="nope")
    with pytest.raises(ValueError, match="needs a path"):
        t2.dump(io.BytesIO(), append=True)


def test_append_refuses_files_that_are_not_kiln_models(tmp_path):
    t, _ = traced(MLP(), arr(4, 6))
    other = tmp_path / "notes.kiln"
    other.write_bytes(b"just some text, long enough to hold a header of sixty-four bytes....")
    with pytest.raises(ValueError, match="is not a kiln model file .*wrong magic"):
        t.dump(str(other), append=True)
    corrupt = tmp_path / "corrupt.kiln"
    t.dump(str(corrupt))
    data = bytearray(corrupt.read_bytes())
    data[200] ^= 1
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is not a kiln model file .*checksum mismatch"):
        t.dump(str(corrupt), append=True)
    assert corrupt.read_bytes() == bytes(data)  # left as it was
    empty = tmp_path / "empty.kiln"
    empty.write_bytes(b"")
    t.dump(str(empty), append=True)  # an empty or missing file: the first graph
    assert kiln.load(str(empty)).graph_names == ["MLP"]


def test_version_1_files_still_load(tmp_path):
    path = os.path.join(ROOT, "tests", "fuzz", "corpus_model", "mlp.kiln")
    copy = tmp_path / "v1.kiln"
    with open(path, "rb") as f:
        copy.write_bytes(f.read())
    t, _ = traced(MLP(), arr(4, 6))
    with pytest.raises(ValueError, match="version 1 file, which holds one graph"):
        t.dump(str(copy), append=True)
    with open(path, "rb") as f:
        assert struct.unpack_from("<I", f.read(12), 8)[0] == 1
    g = kiln.load(path)
    assert (g.version, g.name, g.graph_names, g.op_names, g.var_names) == (1, "graph", ["graph"], [], [])
    for inputs, expected in g.test_cases():
        np.testing.assert_allclose(g(*inputs).asnumpy(), expected[0].asnumpy(), rtol=1e-5, atol=1e-6)


def names_file():
    t, _ = traced(models.simple_function, arr(2, 3), arr(2, 3, seed=1), arr(2, 3, seed=2))
    return dumped(t, arg_names=["xa", "xb", "xc"], optimize_for_inference=False)[0]


def test_corrupt_names_sections_are_refused():
    data = names_file()
    assert kiln.load(data).var_names == ["xa", "xb", "xc", "output"]
    at = data.rindex(b"\x02\x00\x00\x00xb")  # the names section's "xb": its last occurrence
    dup = bytearray(data)
    dup[at + 4:at + 6] = b"xa"
    with pytest.raises(ValueError, match="kiln file: two values are named 'xa'"):
        kiln.load(fix_checksum(dup))
    order = bytearray(data)
    struct.pack_into("<I", order, at - 4, 0)  # xb's value id 1 -> 0, after xa's 0
    with pytest.raises(ValueError, match="kiln file: value name 1 names value 0: not after 0"):
        kiln.load(fix_checksum(order))
    past = bytearray(data)
    struct.pack_into("<I", past, at - 4, 1000)
    with pytest.raises(ValueError, match="names value 1000: .* below"):
        kiln.load(fix_checksum(past))
    long = bytearray(data)
    struct.pack_into("<I", long, at, 5000)  # a 5000-byte name
    with pytest.raises(ValueError, match="value name 1 .* is 5000, at most 4096"):
        kiln.load(fix_checksum(long))


@pytest.mark.skipif(not os.path.exists(KILN_RUN), reason="build/kiln-run is not built")
def test_kiln_run_shows_names_and_runs_each_graph(tmp_path):
    path = tmp_path / "two.kiln"
    x = arr(4, 6)
    t1, _ = traced(MLP(), x)
    t1.dump(str(path), input_data=[x], **ALL)
    t2, _ = traced(models.simple_function, arr(2, 3), arr(2, 3), arr(2, 3))
    t2.dump(str(path), append=True, graph_name="abc", input_data=[(arr(2, 3), arr(2, 3), arr(2, 3))])
    info = subprocess.run([KILN_RUN, str(path), "--model-info", "--iter", "0", "--check"], capture_output=True,
                          text=True, check=True).stdout
    assert "graph: 0 of 2, 'MLP'" in info and "file graph 1: abc" in info
    assert "param %1: fc1.weight" in info and "var %0: x" in info
    assert "priority 1" in info and "op 0 (" in info
    second = subprocess.run([KILN_RUN, str(path), "--graph", "1", "--check", "--iter", "0", "--model-info"],
                            capture_output=True, text=True, check=True).stdout
    assert "graph: 1 of 2, 'abc'" in second and "check: 1 case(s)" in second and ": ok" in second
    named = subprocess.run([KILN_RUN, str(path), "--graph-name", "abc", "--iter", "0", "--check"],
                           capture_output=True, text=True, check=True).stdout
    assert ": ok" in named
    bad = subprocess.run([KILN_RUN, str(path), "--graph", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no graph 2 (the file holds 2)" in bad.stderr
