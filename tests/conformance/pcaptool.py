#!/usr/bin/env python3
"""pcaptool.py -- small, stdlib-only pcap helper of the conformance lab.

  pcaptool.py cells PCAP OUTDIR        cut PCAP at the in-band cell markers (UDP datagrams
                                       "LAB-CELL-BEGIN name" / "LAB-CELL-END name" to port 9)
                                       into OUTDIR/<name>.pcap (markers themselves dropped)
  pcaptool.py cm PCAP [--json]         one line (or JSON object) per CM MAD (RoCEv2, class 0x07)
  pcaptool.py icrc PCAP                recompute the ICRC of every RoCEv2 packet, print counts
  pcaptool.py trim PCAP OUT [--max-cm N] [--no-data] [--first-conns N]
                                       keep ARP/ND and RoCEv2 QP1 (MAD) frames, at most N CM
                                       frames (fixtures); --no-data drops RC data packets;
                                       --first-conns N keeps only the CM MADs of the first N
                                       connections (by comm ID)

The decoder follows docs/wire.md §2 (offsets relative to the MAD header)."""
import json
import os
import struct
import sys
import zlib

ROCE_PORT = 4791
CM_NAMES = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU", 0x15: "DREQ",
            0x16: "DREP", 0x17: "SIDR_REQ", 0x18: "SIDR_REP", 0x19: "LAP", 0x1A: "APR",
            0x01: "ClassPortInfo"}


def read_pcap(path):
    with open(path, "rb") as f:
        gh = f.read(24)
        if len(gh) < 24:
            return gh, []
        magic = struct.unpack("<I", gh[:4])[0]
        e = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
        nano = magic in (0xA1B23C4D, 0x4D3CB2A1)
        out = []
        while True:
            rh = f.read(16)
            if len(rh) < 16:
                break
            sec, frac, incl, orig = struct.unpack(e + "IIII", rh)
            data = f.read(incl)
            if len(data) < incl:
                break
            out.append((sec + frac / (1e9 if nano else 1e6), rh, data))
        return gh, out


def write_pcap(path, gh, frames):
    with open(path, "wb") as f:
        f.write(gh)
        for _, rh, data in frames:
            f.write(rh)
            f.write(data)


def ip_udp(pkt):
    """-> (family, iphdr, udphdr, payload, src, dst) for UDP over IPv4/IPv6 Ethernet frames"""
    if len(pkt) < 14:
        return None
    et = struct.unpack("!H", pkt[12:14])[0]
    if et == 0x0800 and len(pkt) >= 34:
        ihl = (pkt[14] & 0x0F) * 4
        ip = pkt[14:14 + ihl]
        if ip[9] != 17:
            return None
        tot = struct.unpack("!H", ip[2:4])[0]
        udp = pkt[14 + ihl:14 + ihl + 8]
        pay = pkt[14 + ihl + 8:14 + tot]
        src = ".".join(str(b) for b in ip[12:16])
        dst = ".".join(str(b) for b in ip[16:20])
        return 4, ip, udp, pay, src, dst
    if et == 0x86DD and len(pkt) >= 62:
        ip = pkt[14:54]
        if ip[6] != 17:
            return None
        plen = struct.unpack("!H", ip[4:6])[0]
        udp = pkt[54:62]
        pay = pkt[62:54 + plen]
        import ipaddress
        return 6, ip, udp, pay, str(ipaddress.IPv6Address(ip[8:24])), str(ipaddress.IPv6Address(ip[24:40]))
    return None


def icrc(fam, ip, udp, ib):
    """ICRC (IBA A17.8): CRC32 over 8 bytes of 1s (masked LRH), the IP header with TOS/TTL/
    checksum (v4) or traffic class/flow label/hop limit (v6; not the version nibble) set to 1s, the UDP header with its checksum set
    to 1s, and BTH..payload with the BTH resv8a byte (FECN/BECN) set to 1s."""
    ipm = bytearray(ip)
    if fam == 4:
        ipm[1] = 0xFF
        ipm[8] = 0xFF
        ipm[10:12] = b"\xff\xff"
    else:
        ipm[0] |= 0x0F                      # traffic class + flow label; the version stays
        ipm[1:4] = b"\xff\xff\xff"
        ipm[7] = 0xFF
    udpm = bytearray(udp)
    udpm[6:8] = b"\xff\xff"
    ibm = bytearray(ib)
    ibm[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ipm) + bytes(udpm) + bytes(ibm)) & 0xFFFFFFFF


def hex_trim(b):
    b = bytes(b).rstrip(b"\x00")
    return b.hex() if b else "-"


def cma(d, pd):
    """the rdma_cm IP header at the start of REQ / SIDR_REQ private data: version, port,
    source and destination (IPv4 in the last 4 bytes of each 16-byte field)"""
    import ipaddress
    d["cma_ipver"] = pd[1] >> 4
    d["cma_sport"] = struct.unpack("!H", pd[2:4])[0]
    if pd[1] >> 4 == 4:
        d["cma_src"] = ".".join(str(x) for x in pd[16:20])
        d["cma_dst"] = ".".join(str(x) for x in pd[32:36])
    elif pd[1] >> 4 == 6:
        d["cma_src"] = str(ipaddress.IPv6Address(bytes(pd[4:20])))
        d["cma_dst"] = str(ipaddress.IPv6Address(bytes(pd[20:36])))


def decode_cm(mad):
    d = {}
    attr = struct.unpack("!H", mad[16:18])[0]
    d["msg"] = CM_NAMES.get(attr, "0x%04x" % attr)
    d["tid"] = "0x" + mad[8:16].hex()
    d["class_version"] = mad[2]
    d["method"] = mad[3]
    m = mad[24:]
    if attr in (0x10,):
        d["lcid"] = "0x" + m[0:4].hex()
        d["sid"] = "0x" + m[8:16].hex()
        d["ca_guid"] = "0x" + m[16:24].hex()
        d["qpn"] = "0x%06x" % int.from_bytes(m[32:35], "big")
        d["tst"] = (m[43] >> 1) & 3
        d["rcmrt"] = m[43] >> 3
        d["psn"] = "0x%06x" % int.from_bytes(m[44:47], "big")
        d["lcmrt"] = m[47] >> 3
        d["max_cm_retries"] = m[51] >> 4
        d["srq"] = (m[51] >> 3) & 1
        d["ext"] = m[51] & 7
        d["ack_timeout"] = m[95] >> 3
        pd = m[140:232]
        d["pd"] = hex_trim(pd)
        if m[8:13] == b"\x00\x00\x00\x00\x01" and pd[0] == 0:      # IP CM service id + cma_hdr
            cma(d, pd)
            d["upd"] = hex_trim(pd[36:])
    elif attr == 0x13:
        d["lcid"] = "0x" + m[0:4].hex()
        d["rcid"] = "0x" + m[4:8].hex()
        d["qpn"] = "0x%06x" % int.from_bytes(m[12:15], "big")
        d["eecn"] = "0x%06x" % int.from_bytes(m[16:19], "big")
        d["psn"] = "0x%06x" % int.from_bytes(m[20:23], "big")
        d["srq"] = (m[27] >> 4) & 1
        d["pd"] = hex_trim(m[36:232])
    elif attr == 0x12:
        d["lcid"] = "0x" + m[0:4].hex()
        d["rcid"] = "0x" + m[4:8].hex()
        d["rejected"] = m[8] >> 6
        d["ari_len"] = m[9] >> 1
        d["reason"] = struct.unpack("!H", m[10:12])[0]
        d["ari"] = bytes(m[12:12 + min(d["ari_len"], 72)]).hex()
        d["pd"] = hex_trim(m[84:232])
    elif attr == 0x11:
        d["lcid"] = "0x" + m[0:4].hex()
        d["rcid"] = "0x" + m[4:8].hex()
        d["mraed"] = m[8] >> 6
        d["service_timeout"] = m[9] >> 3
    elif attr == 0x15:
        d["lcid"] = "0x" + m[0:4].hex()
        d["rcid"] = "0x" + m[4:8].hex()
        d["rqpn"] = "0x%06x" % int.from_bytes(m[8:11], "big")
        d["pd"] = hex_trim(m[12:232])
    elif attr == 0x17:
        d["request_id"] = "0x" + m[0:4].hex()
        d["pkey"] = "0x" + m[4:6].hex()
        d["sid"] = "0x" + m[8:16].hex()
        pd = m[16:232]
        d["pd"] = hex_trim(pd)
        if m[8:13] == b"\x00\x00\x00\x00\x01" and pd[0] == 0:      # IP CM service id + cma_hdr
            cma(d, pd)
            d["upd"] = hex_trim(pd[36:])
    elif attr == 0x18:
        d["request_id"] = "0x" + m[0:4].hex()
        d["status"] = m[4]
        d["qpn"] = "0x%06x" % int.from_bytes(m[8:11], "big")
        d["sid"] = "0x" + m[12:20].hex()
        d["qkey"] = "0x" + m[20:24].hex()
        d["pd"] = hex_trim(m[96:232])
    elif attr in (0x14, 0x16):
        d["lcid"] = "0x" + m[0:4].hex()
        d["rcid"] = "0x" + m[4:8].hex()
        d["pd"] = hex_trim(m[8:232])
    return d


def cm_frames(frames):
    out = []
    t0 = frames[0][0] if frames else 0
    for i, (t, _, pkt) in enumerate(frames, 1):
        r = ip_udp(pkt)
        if not r:
            continue
        fam, ip, udp, pay, src, dst = r
        if struct.unpack("!H", udp[2:4])[0] != ROCE_PORT or len(pay) < 12 + 8 + 256 + 4:
            continue
        if pay[0] != 0x64:                          # UD SEND only
            continue
        mad = pay[20:20 + 256]
        if mad[1] != 0x07:
            continue
        d = {"frame": i, "t": round(t - t0, 6), "epoch": t, "src": src, "dst": dst,
             "ipver": fam, "sport": struct.unpack("!H", udp[0:2])[0],
             "icrc_ok": struct.unpack("<I", pay[-4:])[0] == icrc(fam, ip, udp, pay[:-4])}
        if fam == 4:
            d["ip_id"] = struct.unpack("!H", ip[4:6])[0]
            d["ip_df"] = bool(ip[6] & 0x40)
        d.update(decode_cm(mad))
        d["mad"] = bytes(mad).hex()
        out.append(d)
    return out


def marker(pkt):
    r = ip_udp(pkt)
    if not r or struct.unpack("!H", r[2][2:4])[0] != 9:
        return None
    txt = r[3].decode("ascii", "replace")
    if txt.startswith("LAB-CELL-BEGIN ") or txt.startswith("LAB-CELL-END "):
        k, name = txt.split(" ", 1)
        return k[9:], name.strip()
    return None


def cmd_cells(pcap, outdir):
    gh, frames = read_pcap(pcap)
    os.makedirs(outdir, exist_ok=True)
    cur, buf, names = None, [], []
    for fr in frames:
        m = marker(fr[2])
        if m:
            kind, name = m
            if kind == "BEGIN":
                cur, buf = name, []
            elif kind == "END" and cur == name:
                write_pcap(os.path.join(outdir, name + ".pcap"), gh, buf)
                names.append("%s:%d" % (name, len(buf)))
                cur = None
            continue
        # ICMP port unreachable answers to the markers are not part of a cell
        if len(fr[2]) > 34 and fr[2][12:14] == b"\x08\x00" and fr[2][23] == 1:
            continue
        if cur is not None:
            buf.append(fr)
    print("cells:", " ".join(names))


def cmd_cm(pcap, as_json):
    _, frames = read_pcap(pcap)
    for d in cm_frames(frames):
        if as_json:
            print(json.dumps(d))
        else:
            keys = [k for k in d if k not in ("frame", "t", "epoch", "src", "dst", "msg", "mad")]
            print("%5d %9.6f %s -> %s %-5s %s" % (d["frame"], d["t"], d["src"], d["dst"], d["msg"],
                  " ".join("%s=%s" % (k, d[k]) for k in keys)))


def cmd_icrc(pcap):
    _, frames = read_pcap(pcap)
    ok = bad = 0
    for _, _, pkt in frames:
        r = ip_udp(pkt)
        if not r or struct.unpack("!H", r[2][2:4])[0] != ROCE_PORT or len(r[3]) < 16:
            continue
        fam, ip, udp, pay, _, _ = r
        if struct.unpack("<I", pay[-4:])[0] == icrc(fam, ip, udp, pay[:-4]):
            ok += 1
        else:
            bad += 1
    print("icrc: %d ok, %d bad" % (ok, bad))
    return 0 if ok and not bad else 1


def first_conn_frames(frames, n):
    """frame indexes of the CM MADs of the first n connections (REQ local comm IDs and the
    peer comm IDs learnt from the replies)"""
    ids, nreq, keep = set(), 0, set()
    for i, d in enumerate(cm_frames(frames)):
        if d["msg"] == "REQ" and d["lcid"] not in ids:
            nreq += 1
            if nreq > n:
                continue
            ids.add(d["lcid"])
        if d.get("lcid") in ids or d.get("rcid") in ids:
            ids.add(d.get("lcid"))
            keep.add(d["frame"] - 1)
    return keep


def cmd_trim(pcap, out, max_cm, no_data, first_conns=None):
    gh, frames = read_pcap(pcap)
    keep, ncm = [], 0
    if first_conns:
        sel = first_conn_frames(frames, first_conns)
        frames = [fr for i, fr in enumerate(frames) if i in sel or
                  (len(fr[2]) >= 14 and fr[2][12:14] == b"\x08\x06")]
    for fr in frames:
        pkt = fr[2]
        et = struct.unpack("!H", pkt[12:14])[0] if len(pkt) >= 14 else 0
        if et == 0x0806:
            keep.append(fr)
            continue
        r = ip_udp(pkt)
        if r and struct.unpack("!H", r[2][2:4])[0] == ROCE_PORT:
            pay = r[3]
            is_mad = len(pay) >= 20 + 256 and pay[0] == 0x64 and struct.unpack("!I", pay[4:8])[0] & 0xFFFFFF == 1
            if is_mad:
                if pay[20 + 1] == 0x07:
                    ncm += 1
                    if max_cm is not None and ncm > max_cm:
                        continue
                keep.append(fr)
            elif not no_data:
                keep.append(fr)
    write_pcap(out, gh, keep)
    print("trim: kept %d of %d frames (%d CM)" % (len(keep), len(frames), min(ncm, max_cm or ncm)))


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    cmd = argv[1]
    if cmd == "cells":
        cmd_cells(argv[2], argv[3])
    elif cmd == "cm":
        cmd_cm(argv[2], "--json" in argv)
    elif cmd == "icrc":
        return cmd_icrc(argv[2])
    elif cmd == "trim":
        mx = int(argv[argv.index("--max-cm") + 1]) if "--max-cm" in argv else None
        fc = int(argv[argv.index("--first-conns") + 1]) if "--first-conns" in argv else None
        cmd_trim(argv[2], argv[3], mx, "--no-data" in argv, fc)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
