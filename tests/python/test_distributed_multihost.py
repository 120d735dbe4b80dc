"""Launching ranks on several hosts: `python -m kiln.distributed.run --nproc 2 --host A,B train.py`
(mpirun's --host), its ranks talking over TCP.

- Two network namespaces as two hosts (needs root and CAP_NET_ADMIN; skipped, saying why, where
  `ip netns add` is refused): each holds one end of a veth pair and nothing else, mpirun runs in
  the first, and the second's rank is started through an rsh agent that enters its namespace
  (the part ssh plays between machines).
- Two addresses of this machine (localhost and 127.0.0.1) as two hosts, over loopback.

In both, Open MPI's transports are limited to TCP (OMPI_MCA_btl=tcp,self: no shared memory, vader
or sm), and the proof that the data went over TCP is taken from the sockets: each rank lists its
established TCP connections with the bytes received on each (ss), and the two ranks' lists hold
the two ends of one connection over which both received at least the all-reduced megabytes (in
the namespaces, the veth pair's counters show them too). The ranks then train the seed's
attention block data-parallel, equal to one process on the whole batch."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from distributed_util import HERE, PYTHON_DIR, needs_mpi

pytestmark = needs_mpi

MEGABYTES = 4

PROGRAM = f"""
import os
import re
import subprocess
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C
import distributed_blocks as D

communication.init()
r, n = communication.get_rank(), communication.get_group_size()
assert n == 2
x = kiln.tensor(np.full({MEGABYTES} * 2 ** 18, r + 1.0, np.float32))
assert (C.all_reduce(x).numpy() == 3.0).all()
# this process's TCP connections: (local, peer, bytes received)
ss = subprocess.run(["ss", "-tnpi", "state", "established"], capture_output=True, text=True).stdout
lines, sockets = ss.splitlines(), []
for k, line in enumerate(lines):
    if f"pid={{os.getpid()}}," in line and k + 1 < len(lines):
        fields = line.split()
        received = re.search(r"bytes_received:(\\d+)", lines[k + 1])
        sockets.append(f"{{fields[-3]}}>{{fields[-2]}}={{received.group(1) if received else 0}}")
# a file per rank: the ranks' stdout lines reach mpirun's in pieces that can interleave
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"sockets-{{r}}.txt"), "w") as f:
    f.write(f"sockets rank {{r}} " + " ".join(sockets) + "\\n")

batches = D.global_batches("attention", 2, n)
ref_net = D.make_net("attention")
ref_losses = [l.item() for l in D.train(D.mindspore_step(ref_net, D.optimizer(ref_net), "eager", False), batches)]
net = D.make_net("attention")
step = D.mindspore_step(net, D.optimizer(net), "eager", True)
losses = [C.all_reduce(l, "mean").item() for l in D.train(step, [D.shard(b, r, n) for b in batches])]
np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
for p, q in zip(net.trainable_params(), ref_net.trainable_params()):
    np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=2e-6)
print(f"rank {{r}} ok", flush=True)
"""


def _launch(tmp, hosts, env_extra, prefix=()):
    path = os.path.join(tmp, "train.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(PROGRAM))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, HERE]), OMPI_MCA_btl="tcp,self")
    env.update(env_extra)
    cmd = [*prefix, sys.executable, "-m", "kiln.distributed.run", "--nproc", "2", "--threads", "1",
           "--host", ",".join(hosts), path]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    for r in range(2):
        assert f"rank {r} ok" in p.stdout, out[-6000:]
    sockets = ""
    for r in range(2):
        with open(os.path.join(tmp, f"sockets-{r}.txt")) as f:
            sockets += f.read()
    return p, sockets


def _connections(text):
    """{rank: {(local, peer): bytes received}} from the ranks' "sockets" lines."""
    out = {}
    for rank, rest in re.findall(r"sockets rank (\d) ?(.*)", text):
        out[int(rank)] = {}
        for item in rest.split():
            ends, received = item.rsplit("=", 1)
            local, peer = ends.split(">")
            out[int(rank)][(local, peer)] = int(received)
    return out


def _assert_tcp_between_the_ranks(text):
    conns = _connections(text)
    assert set(conns) == {0, 1}, text
    moved = MEGABYTES * 2 ** 20
    shared = [(ends, got) for ends, got in conns[0].items() if (ends[1], ends[0]) in conns[1]]
    assert shared, f"no TCP connection joins the two ranks: {conns}"
    assert any(got >= moved and conns[1][(ends[1], ends[0])] >= moved for ends, got in shared), \
        f"less than {MEGABYTES} MB went over the TCP connections between the ranks: {shared}"
    return shared


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read the ranks' TCP connections")
def test_two_hosts_over_loopback_tcp():
    with tempfile.TemporaryDirectory(prefix="kiln-multihost-") as tmp:
        _, sockets = _launch(tmp, ["localhost", "127.0.0.1"], {"OMPI_MCA_btl_tcp_if_include": "lo"})
    _assert_tcp_between_the_ranks(sockets)


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.mark.skipif(shutil.which("ss") is None or shutil.which("ip") is None,
                    reason="needs ip and ss (iproute2) for network namespaces and the ranks' TCP connections")
def test_two_hosts_in_separate_network_namespaces():
    tag = f"k{os.getpid() % 100000}"
    spaces, addresses = [f"{tag}a", f"{tag}b"], ["10.213.0.1", "10.213.0.2"]
    made = []
    try:
        for ns in spaces:
            p = _ip("netns", "add", ns, check=False)
            if p.returncode != 0:
                pytest.skip(f"network namespaces are not permitted here (`ip netns add` failed: {p.stderr.strip()})")
            made.append(ns)
        ends = [f"{tag}va", f"{tag}vb"]
        p = _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1], check=False)
        if p.returncode != 0:
            pytest.skip(f"veth pairs are not permitted here (`ip link add` failed: {p.stderr.strip()})")
        for ns, end, address in zip(spaces, ends, addresses):
            _ip("link", "set", end, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", end)
            _ip("-n", ns, "link", "set", end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        with tempfile.TemporaryDirectory(prefix="kiln-netns-") as tmp:
            # mpirun's "ssh": the first argument is the host, the rest a shell command for it
            agent = os.path.join(tmp, "netns_agent.sh")
            with open(agent, "w") as f:
                f.write("#!/bin/sh\nhost=$1; shift\ncase $host in\n"
                        + "".join(f"  {a}) ns={ns} ;;\n" for a, ns in zip(addresses, spaces))
                        + "  *) echo \"netns_agent: unknown host $host\" >&2; exit 1 ;;\nesac\n"
                        'exec ip netns exec "$ns" /bin/sh -c "$*"\n')
            os.chmod(agent, 0o755)
            _, sockets = _launch(tmp, addresses, {"OMPI_MCA_plm_rsh_agent": agent}, prefix=["ip", "netns", "exec", spaces[0]])
        received = int(_ip("netns", "exec", spaces[1], "cat", f"/sys/class/net/{ends[1]}/statistics/rx_bytes").stdout)
    finally:
        for ns in made:
            _ip("netns", "del", ns, check=False)
    shared = _assert_tcp_between_the_ranks(sockets)
    for (local, peer), _ in shared:  # the connection joins the two namespaces' addresses
        assert {local.rsplit(":", 1)[0], peer.rsplit(":", 1)[0]} == set(addresses), shared
    assert received >= MEGABYTES * 2 ** 20, f"the second namespace's veth received {received} bytes"
