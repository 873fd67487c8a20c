# SPDX-License-Identifier: BSD-3-Clause
# soak_system.py — what soak.py reads of the machine and of malld: cpu lists as bit masks, /proc
# readers (threads' masks, children, rss, open descriptors, the processes a run marked) and a
# Status client on malld's wire protocol. Contract: reads only; nothing here starts or changes
# anything.
import json
import os
import re
import socket
import struct

# ---------------------------------------------------------------------------------------------
# cpu lists as bit masks


def parse_cpus(text):
    """Linux list text ("0-1,3") to a bit mask; "" is 0."""
    mask = 0
    text = text.strip()
    if not text:
        return 0
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            for c in range(int(lo), int(hi) + 1):
                mask |= 1 << c
        else:
            mask |= 1 << int(part)
    return mask


def cpus_text(mask):
    out, c = [], 0
    while mask >> c:
        if mask >> c & 1:
            start = c
            while mask >> (c + 1) & 1:
                c += 1
            out.append(str(start) if start == c else "%d-%d" % (start, c))
        c += 1
    return ",".join(out)


def fnv_steps(n):
    """mall_test_client's checksum: FNV-1a 64 over the step numbers 1..n as 8 LE bytes."""
    h = 0xCBF29CE484222325
    for s in range(1, n + 1):
        for i in range(8):
            h ^= (s >> (8 * i)) & 0xFF
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


# ---------------------------------------------------------------------------------------------
# /proc readers (everything tolerates a process that is gone)


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def proc_stat(pid):
    """(state, ppid, pgid, starttime) or None."""
    text = read_text("/proc/%d/stat" % pid)
    if not text:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[19])


def live_threads_mask(pid):
    """Union of Cpus_allowed_list over the pid's threads that are not zombies or dead."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0
    mask = 0
    for tid in tids:
        text = read_text("/proc/%d/task/%s/status" % (pid, tid))
        if not text:
            continue
        i = text.find("\nState:\t")
        if i >= 0 and text[i + 8] in "ZX":
            continue
        j = text.find("\nCpus_allowed_list:\t")
        if j < 0:
            continue
        k = text.find("\n", j + 20)
        mask |= parse_cpus(text[j + 20:k])
    return mask


def children_of(pid):
    out = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        text = read_text("/proc/%d/task/%s/children" % (pid, tid))
        if text:
            out.extend(int(p) for p in text.split())
    return out


def descendants_of(pid):
    out, todo = [], children_of(pid)
    while todo and len(out) < 256:
        p = todo.pop()
        out.append(p)
        todo.extend(children_of(p))
    return out


def rss_kib(pid):
    text = read_text("/proc/%d/status" % pid) or ""
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else -1


def fd_targets(pid):
    out = []
    try:
        for fd in sorted(os.listdir("/proc/%d/fd" % pid), key=int):
            try:
                out.append(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
            except OSError:
                pass
    except OSError:
        pass
    return out


def fd_kind(target):
    """socket:[123] -> socket, anon_inode:[eventpoll] -> eventpoll, /path -> the path."""
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("anon_inode:"):
        return target[len("anon_inode:"):].strip("[]")
    return target


def processes_marked(marker):
    """Pids (other than this process and its ancestors) whose environment holds marker."""
    mine = set()
    p = os.getpid()
    while p > 1:
        mine.add(p)
        st = proc_stat(p)
        if not st:
            break
        p = st[1]
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            st = proc_stat(int(name))
            if st and st[0] not in "ZX":
                found.append(int(name))
    return found


# ---------------------------------------------------------------------------------------------
# malld's wire protocol, just enough for Status (what `mallctl status --json` prints): a Unix
# SOCK_SEQPACKET socket, a 16-byte header (magic "MALL", version 1, type, length, request id)
# and a JSON object. The sampler asks twice per sample; a process per ask would cost more than
# the sampling itself.

MAGIC, VERSION, T_STATUS, T_REPLY = 0x4C4C414D, 1, 6, 64
HEADER = struct.Struct("<IHHII")


class StatusClient:
    def __init__(self, path):
        self.path = path
        self.sock = None
        self.request_id = 0

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None

    def status(self, timeout=1.0):
        """The status object, or None when malld does not answer."""
        try:
            if not self.sock:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
                s.settimeout(timeout)
                s.connect(self.path)
                self.sock = s
            self.request_id += 1
            payload = b"{}"
            self.sock.send(HEADER.pack(MAGIC, VERSION, T_STATUS, len(payload), self.request_id) + payload)
            while True:
                packet = self.sock.recv(HEADER.size + 65536)
                if len(packet) < HEADER.size:
                    raise OSError("malld closed the connection")
                magic, version, kind, length, rid = HEADER.unpack_from(packet)
                if magic != MAGIC or version != VERSION:
                    raise SystemExit("soak: malld speaks protocol version %d, this sampler %d" % (version, VERSION))
                if kind == T_REPLY and rid == self.request_id:
                    body = json.loads(packet[HEADER.size:HEADER.size + length])
                    return body if body.get("ok") else None
        except (OSError, ValueError):
            self.close()
            return None
