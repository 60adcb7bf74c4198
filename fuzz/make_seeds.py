#!/usr/bin/env python3
"""Writes the seed corpus (corpus/<target>/*): well-formed inputs of every kind
each target parses, plus a few broken ones. Re-run after a format change."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC, VERSION = 0x53444E54, 1
OPS = dict(set=1, get=2, try_get=3, add=4, wait=5, check=6, erase=7, hello=8, goodbye=9, heartbeat=10,
           auth_begin=11, auth=12, ok=100, value=101, not_found=102, error=103)


def frame(op, key=b"", value=b"", magic=MAGIC, version=VERSION):
    return struct.pack("<IHHII", magic, version, OPS[op] if isinstance(op, str) else op, len(key), len(value)) + key + value


def keys(*ks):
    return struct.pack("<I", len(ks)) + b"".join(struct.pack("<I", len(k)) + k for k in ks)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


u64 = lambda v: struct.pack("<Q", v)
store = {
    "set": frame("set", b"job/rank/0", b"ucx-address-bytes"),
    "get": frame("get", b"job/rank/1", u64(5000)),
    "get_2_63": frame("get", b"never", u64(1 << 63)),
    "try_get": frame("try_get", b"k"),
    "add": frame("add", b"counter", b"-12"),
    "wait": frame("wait", b"", u64(100) + keys(b"a", b"bb", b"")),
    "check": frame("check", b"", keys(b"tandem/failed_ranks")),
    "erase": frame("erase", b"k"),
    "hello": frame("hello", b"", b"3"),
    "goodbye": frame("goodbye"),
    "heartbeat": frame("heartbeat", b"", b"2:2000"),
    "auth_begin": frame("auth_begin"),
    "auth": frame("auth", b"", bytes(range(32))),
    "responses": frame("ok") + frame("value", b"k", b"v") + frame("not_found", b"", b"a,b") + frame("error", b"", b"why"),
    "stream": frame("hello", b"", b"0") + frame("set", b"a", b"1") + frame("get", b"a", u64(10)) + frame("goodbye"),
    "bad_magic": frame("set", b"k", b"v", magic=0xDEADBEEF),
    "bad_version": frame("set", b"k", b"v", version=2),
    "truncated": frame("set", b"key", b"value")[:-3],
    "huge_lengths": struct.pack("<IHHII", MAGIC, VERSION, 1, 0xFFFFFFFF, 0xFFFFFFFF),
    "length_2_63": struct.pack("<IHHQ", MAGIC, VERSION, 1, 1 << 63),
    "bad_key_list": frame("check", b"", struct.pack("<I", 1000) + b"xx"),
}
for name, data in store.items():
    write("store_frames", name, data)

# handshake: byte 0 bit 0 = secret; then (request index, mode) pairs.
# Request indices: 0 set .. 10 auth_begin, 11 auth; AUTH mode % 3: 0 right proof, 1 replay, 2 bytes.
write("handshake", "right", bytes([1, 10, 0, 11, 0, 0, 0, 7, 0]))
write("handshake", "no_secret", bytes([0, 0, 0, 10, 0, 11, 0, 1, 0]))
write("handshake", "request_first", bytes([1, 0, 0]))
write("handshake", "auth_without_challenge", bytes([1, 11, 0]))
write("handshake", "wrong_proof", bytes([1, 10, 0, 11, 5]) + b"guess")
write("handshake", "replay", bytes([1, 10, 0, 10, 0, 11, 1]))
write("handshake", "twice", bytes([1, 10, 0, 11, 0, 11, 0, 10, 0]))

# text: NUL-separated fields, in the order of text_fuzz.cc's kVariables, then
# store address, interface override, locator, Slurm host list, shared-memory
# path rows; "-" = unset.
NVARS = 53
def env(values, address=b"127.0.0.1:29500", override=b"eth,ib", locator=b"4242:7:140737488355328",
        hostlist=b"node[01-04,07],gpu3"):
    fields = [b"-"] * NVARS
    for i, v in values.items():
        fields[i] = v
    return b"\0".join(fields + [address, override, locator, hostlist])
write("text", "tandem_launch", env({0: b"1", 1: b"4", 2: b"1", 3: b"4", 4: b"127.0.0.1:29500", 8: b"launch-1",
                                     9: b"k" * 64, 7: b"2000"}))
write("text", "open_mpi", env({20: b"0", 21: b"2", 22: b"0", 23: b"2"}, override=b"^docker,lo"))
write("text", "slurm", env({24: b"3", 25: b"8", 26: b"1", 28: b"4(x2)", 29: b"77", 30: b"0"}, override=b"=eth0"))
write("text", "master_addr", env({20: b"1", 21: b"2", 18: b"::1", 19: b"29500"}, address=b"[::1]:1"))
write("text", "bad_numbers", env({0: b"99999999999", 1: b"-1", 5: b"1e9"}, address=b"host:99999", locator=b"1:2"))
write("text", "host_store", env({0: b"0", 1: b"2", 4: b"10.0.0.1:1234", 17: b"1", 31: b"eth0", 32: b"eth1"}))
write("text", "per_host_override", env({}, override=b"hostA:eth0;hostB:ib0", locator=b"-1:-1:18446744073709551616"))
write("text", "torchrun", env({38: b"3", 39: b"4", 40: b"1", 41: b"2", 18: b"10.0.0.1", 19: b"29500", 9: b"k" * 64}))
write("text", "hydra", env({42: b"1", 43: b"2", 44: b"1", 45: b"2", 46: b"7"}, hostlist=b"rack[1-2]-n[01,03]"))
write("text", "srun_pmi2", env({24: b"1", 25: b"4", 26: b"1", 29: b"4242", 42: b"1", 43: b"4", 47: b"1"}))
write("text", "slurm_nodelist", env({24: b"0", 25: b"8", 26: b"0", 29: b"4242", 30: b"1", 47: b"2", 49: b"gpu[3-4]",
                                     50: b"n[01-08]", 52: b"gpu3", 9: b"k" * 64}, hostlist=b"n[1-"))
write("text", "shm_paths", env({}) + b"\0allreduce:heap:256K-16M=timed, alltoall:*:1M-=cma,*:shared:*=staged")
write("text", "shm_paths_bad", env({}) + b"\0allreduce:heap:16M-256K=timed,reduce::=mapped,*:*:8K-=cma,x")

# shm_header: two slot headers (40 bytes each: stamp, reduced, Call{count, kind, dtype, op, root}, history).
def call(count, kind, dtype, op, root):
    return struct.pack("<QBBBxi", count, kind, dtype, op, root)
def slot(stamp, c, history=0):
    return struct.pack("<QQ", stamp, 0) + c + struct.pack("<Q", history)
write("shm_header", "same_allreduce", slot(1, call(1024, 1, 0, 0, -1)) + slot(1, call(1024, 1, 0, 0, -1)))
write("shm_header", "dtype_differs", slot(5, call(7, 1, 0, 0, -1)) + slot(5, call(7, 1, 2, 0, -1)))
write("shm_header", "broadcast_root", slot(2, call(9, 4, 6, 0, 3)) + slot(2, call(9, 4, 6, 0, 1)))
write("shm_header", "garbage", bytes(range(256)) * 2)

# fingerprint: two 24-byte fingerprints {seq, kind, dtype+1, op+1, unused, root, count}.
def fp(seq, kind, dtype, op, root, count):
    return struct.pack("<IBBBxiQ", seq, kind, dtype, op, root, count)
write("fingerprint", "same", fp(3, 1, 1, 1, -1, 100) + fp(3, 1, 1, 1, -1, 100))
write("fingerprint", "count_differs", fp(3, 1, 1, 1, -1, 100) + fp(3, 1, 1, 1, -1, 101))
write("fingerprint", "barrier_vs_broadcast", fp(9, 5, 0, 0, -1, 0) + fp(9, 4, 3, 0, 2, 64))
write("fingerprint", "garbage", bytes(range(255, 207, -1)))
