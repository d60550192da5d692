"""Where each sequential reconcile's time went, hop by hop (hack/trace-reconcile.sh).

Reads, from the directory given: `threads` ("ROLE PID TID" for the
threads of the bench, kplug, the relay and the plugin, and of a baseline
build and its plugin when the bench ran one), `sockets` ("PID FD INODE"),
`tcp` (/proc/net/tcp) and `events` (perf script -F
pid,tid,cpu,time,event,trace of the scheduler's switches and wakeups and
the socket calls). Follows each call of each route
from the bench's first write to its first read of the answer, cuts it into
hops at the first or last read or write of each process on each
connection, and prints a Markdown table per route: each hop's median wall
time, the mean CPU time each process ran during it and the mean wakeups of
each process's threads. "other" is every other process, perf included.
"""

import bisect
import collections
import re
import statistics
import sys
from pathlib import Path

SEND_CALLS = {"writev", "sendto"}
# How far before a hop to look for a run on a CPU that overlaps it. While
# the bench calls, every CPU switches tasks within microseconds; a longer
# run is missed in part, which undercounts rather than miscounts.
LONGEST_RUN_SECONDS = 0.05
LINE = re.compile(r"\s*(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)")

# A call's path: each mark is the first read or write of a process on a
# connection after the mark before it ("last": the last one before the next
# mark, for an answer read in pieces). "proxy" is kplug or the relay.
PROXIED_PATH = [
    ("bench", "send", "proxy"),
    ("proxy", "recv", "bench"),
    ("proxy", "send", "plugin"),
    ("plugin", "recv", "proxy"),
    ("plugin", "send", "proxy"),
    ("proxy", "recv", "plugin", "last"),
    ("proxy", "send", "bench"),
    ("bench", "recv", "proxy"),
]
PROXIED_HOPS = [
    "the request to the proxy",
    "the proxy, in: the request read to the plugin's sent",
    "the request to the plugin",
    "the plugin",
    "the answer to the proxy",
    "the proxy, out: the plugin's answer read to its own sent",
    "the answer to the bench",
]
DIRECT_PATH = [
    ("bench", "send", "plugin"),
    ("plugin", "recv", "bench"),
    ("plugin", "send", "bench"),
    ("bench", "recv", "plugin"),
]
DIRECT_HOPS = ["the request to the plugin", "the plugin", "the answer to the bench"]


def load(directory):
    roles, thread_roles = {}, {}
    for line in (directory / "threads").read_text().split("\n"):
        if line:
            role, pid, tid = line.split()
            roles[pid] = thread_roles[tid] = role
    ports = {}
    for line in (directory / "tcp").read_text().split("\n")[1:]:
        fields = line.split()
        if len(fields) > 9:
            ports[fields[9]] = (int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16))
    sockets = {}
    for line in (directory / "sockets").read_text().split("\n"):
        if line:
            pid, fd, inode = line.split()
            if inode in ports:
                sockets[(pid, int(fd))] = ports[inode]
    return roles, thread_roles, sockets


def peers(roles, sockets):
    """The role at the other end of each (pid, fd), by matching ports."""
    by_local = {local: roles.get(pid) for (pid, _), (local, _) in sockets.items()}
    return {key: by_local.get(remote) for key, (_, remote) in sockets.items()}


def read_events(directory, roles, thread_roles, peer_of):
    """Socket reads and writes (time, role, "send" | "recv", peer role),
    run intervals (start, end, role) and wakeups (time, role woken)."""
    running, pending = {}, {}
    io, intervals, wakeups = [], [], []
    for line in open(directory / "events"):
        match = LINE.match(line)
        if not match:
            continue
        pid, tid, cpu, at, event, args = match.groups()
        at = float(at)
        if event == "sched:sched_switch":
            following = re.search(r"next_pid=(\d+)", args).group(1)
            if cpu in running:
                started, previous = running[cpu]
                role = "idle" if previous == "0" else thread_roles.get(previous, "other")
                intervals.append((started, at, role))
            running[cpu] = (at, following)
        elif event == "sched:sched_wakeup":
            woken = re.search(r" pid=(\d+)", args).group(1)
            wakeups.append((at, thread_roles.get(woken, "other")))
        elif pid in roles and event.startswith("syscalls:sys_enter_"):
            fd = int(re.search(r"fd: (0x[0-9a-f]+)", args).group(1), 16)
            pending[tid] = (event.rsplit("_", 1)[1], fd, at)
        elif pid in roles and event.startswith("syscalls:sys_exit_") and tid in pending:
            call, fd, entered = pending.pop(tid)
            returned = int(args.strip(), 16)
            peer = peer_of.get((pid, fd))
            # Negative returns (errors, EAGAIN) are 2^64 - errno here.
            if peer is None or returned == 0 or returned >= 1 << 63:
                continue
            if call in SEND_CALLS:
                io.append((entered, roles[pid], "send", peer))
            else:
                io.append((at, roles[pid], "recv", peer))
    io.sort()
    intervals.sort()
    wakeups.sort()
    return io, intervals, wakeups


def calls(io, server, path):
    """The times of `path`'s marks in each call to `server` (kplug, the
    relay or the plugin) that went the whole path."""
    rename = {} if server == "plugin" else {server: "proxy"}
    if server == "baseline":
        # The baseline build calls a plugin process of its own.
        rename.update({"baseline-plugin": "plugin", "plugin": "plugin of this build"})
    found, current = [], None
    for at, role, kind, peer in io:
        role, peer = rename.get(role, role), rename.get(peer, peer)
        involved = {role, peer} <= {"bench", "plugin", "proxy"} and path[0][2] in (role, peer)
        if not involved:
            continue
        if current is None:
            if (role, kind, peer) != path[0][:3]:
                continue
            current = []
        current.append((at, (role, kind, peer)))
        # The call ends at the bench's first read after the answer's send.
        if (role, kind, peer) == path[-1][:3] and any(e[1] == path[-2][:3] for e in current):
            marks = walk(current, path)
            if marks:
                found.append(marks)
            current = None
    return found


def walk(events, path):
    """Each mark's time along `path` in one call's events, or None."""
    marks, index = [], 0
    for step, following in zip(path, path[1:] + [None]):
        while index < len(events) and events[index][1] != step[:3]:
            index += 1
        if index == len(events):
            return None
        at = events[index][0]
        if len(step) == 4:  # the last of a run, before the next mark
            for later, what in events[index + 1 :]:
                if following and what == following[:3]:
                    break
                if what == step[:3]:
                    at = later
        marks.append(at)
        index += 1
    return marks


def on_cpu(intervals, starts, begin, end):
    spent = collections.Counter()
    for started, ended, role in intervals[bisect.bisect_left(starts, begin - LONGEST_RUN_SECONDS):]:
        if started >= end:
            break
        overlap = min(ended, end) - max(started, begin)
        if overlap > 0:
            spent[role] += overlap * 1e6
    return spent


def report(name, found, hops, intervals, wakeups):
    starts = [interval[0] for interval in intervals]
    woken_at = [wakeup[0] for wakeup in wakeups]
    print(f"### {name}: {len(found)} calls\n")
    print("| Hop | Wall p50 | CPU in it, mean per call | Wakeups in it, mean per call |")
    print("|---|---:|---|---|")
    spans_of = [[(marks[i], marks[i + 1]) for marks in found] for i in range(len(hops))]
    spans_of.append([(marks[0], marks[-1]) for marks in found])
    for hop, spans in zip(hops + ["the whole call"], spans_of):
        spent, woken = collections.Counter(), collections.Counter()
        for first, last in spans:
            spent.update(on_cpu(intervals, starts, first, last))
            lo, hi = bisect.bisect_left(woken_at, first), bisect.bisect_left(woken_at, last)
            woken.update(role for _, role in wakeups[lo:hi])
        wall = statistics.median((last - first) * 1e6 for first, last in spans)
        cpu = ", ".join(f"{role} {t / len(spans):.0f} µs" for role, t in spent.most_common() if t / len(spans) >= 1)
        wakes = ", ".join(f"{role} {n / len(spans):.1f}" for role, n in woken.most_common() if n / len(spans) >= 0.1)
        print(f"| {hop} | {wall:.0f} µs | {cpu} | {wakes} |")
    print()


def main():
    directory = Path(sys.argv[1])
    roles, thread_roles, sockets = load(directory)
    io, intervals, wakeups = read_events(directory, roles, thread_roles, peers(roles, sockets))
    routes = [
        ("Through kplug", "kplug", PROXIED_PATH, PROXIED_HOPS),
        ("Through the relay", "relay", PROXIED_PATH, PROXIED_HOPS),
        ("Direct", "plugin", DIRECT_PATH, DIRECT_HOPS),
    ]
    if "baseline" in roles.values():
        routes.insert(1, ("Through the baseline build", "baseline", PROXIED_PATH, PROXIED_HOPS))
    for name, server, path, hops in routes:
        found = calls(io, server, path)
        if not found:
            sys.exit(f"no call {name.lower()} was recorded")
        report(name, found, hops, intervals, wakeups)


if __name__ == "__main__":
    main()
