#!/usr/bin/env python3
"""Builds the seed corpus for the fuzz targets from fixtures/ (stdlib only)."""
import hashlib, os, struct, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
fx = os.path.join(root, "fixtures")
out = os.path.join(root, "fuzz", "corpus")
LINK_TYPES = [1, 101, 228, 229, 113, 276, 247, 197]

def put(target, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    open(os.path.join(d, name), "wb").write(data)

def pcap_records(path):
    d = open(path, "rb").read()
    if len(d) < 24:
        return
    magic = struct.unpack("<I", d[:4])[0]
    if magic in (0xa1b2c3d4, 0xa1b23c4d):
        e = "<"
    elif magic in (0xd4c3b2a1, 0x4d3cb2a1):
        e = ">"
    else:
        return
    lt = struct.unpack(e + "I", d[20:24])[0] & 0x03FFFFFF
    off = 24
    while off + 16 <= len(d):
        _, _, incl, _ = struct.unpack(e + "IIII", d[off:off + 16])
        off += 16
        yield lt, d[off:off + incl]
        off += incl

mads = os.path.join(fx, "mads")
for f in sorted(os.listdir(mads)):
    if f.endswith(".bin") and not f.startswith("frame_"):
        b = open(os.path.join(mads, f), "rb").read()
        put("mad_parse", b)
        put("mad_roundtrip", b)

caps = []
for dirpath, _, files in os.walk(os.path.join(fx, "captures")):
    caps += [os.path.join(dirpath, f) for f in files if f.endswith((".pcap", ".pcapng"))]
# trace_views: the whole run; the captures with SA MADs and a few small CM ones.
TRACE_VIEWS = ("sa_pathrecord_ib.pcap", "ib_linktype247_from_erf.pcap", "ib_cm_lid_only.pcap",
               "rej8_no_listener.pcap", "mra_slow_accept.pcap", "cm_eth.pcap")
for c in sorted(caps):
    if os.path.basename(c) in TRACE_VIEWS:
        put("trace_views", open(c, "rb").read())
    if os.path.getsize(c) < 20000:
        put("capture_read", open(c, "rb").read())
    seen = 0
    for lt, data in pcap_records(c):
        if lt in LINK_TYPES and seen < 8:
            put("frame_decode", bytes([LINK_TYPES.index(lt)]) + data)
            seen += 1
print("corpus written to", out)
