"""Where kplug's CPU per reconcile goes beside the relay's, by crate
(hack/profile-reconcile.sh).

Reads, from the directory given:
- `pids`: "ROLE PID" for kplug, the relay and, when the bench ran one, the
  baseline build;
- `recording`: perf's sampling frequency, the clock ticks per second and
  the sequential calls per route;
- `sequential.cpu-before`, `sequential.cpu-after`: each process's CPU
  ticks when the sequential phase's recording started and ended;
- `sequential.samples`, `throughput.samples`: perf script -F
  pid,ip,sym,dso of the two phases' cpu-clock recordings;
- `reconcile.md`: the bench's report.

Each sample is charged to the crate of the function it was taken in (the
kernel, the allocator and libc's functions apart; a drop to the dropped
type's crate). One call at a time, a process's samples share out its CPU
time over the phase (/proc) divided by the calls; at 32 in flight, the CPU
per reconcile the bench itself measured for that process (the 1 KiB object
over one connection), so that that table adds up to the bench's figure.
Prints Markdown per phase: by crate, then kplug's busiest functions beside
the others' time in the same ones.
"""

import collections
import re
import sys
from pathlib import Path

# Each process's row in the bench's throughput table, by its route.
THROUGHPUT_ROWS = {
    "kplug": "through kplug",
    "baseline": "through kplug (baseline)",
    "relay": "through a relay",
}
# glibc's malloc and jemalloc, whose internals (extents, arenas, caches)
# have bare C names.
ALLOCATOR = re.compile(r"^(_rjem_|je_|__rustc::|__rust_|__rdl_|__rg_|_int_malloc|_int_free|_int_memalign|"
                       r"_mid_memalign|malloc|cfree|free|__posix_memalign|sysmalloc|"
                       r"unlink_chunk|tcache_|realloc|calloc|sdallocx|do_rallocx|extent_|emap_|"
                       r"pac_|arena_|ticker_|nstime_)")
# `<T as some_crate::Trait>::method`: a generic or a primitive type, so
# the trait's crate is the one to charge.
GENERIC_IMPL = re.compile(r"^<(?:[A-Z]|[&*]?(?:u|i|f)(?:8|16|32|64|128|size)|&?str|char|bool)"
                          r"(?:[^ ]*)? as ")
RUST_STD = {"core", "alloc", "std"}
SYMBOLS_SHOWN = 20
# Rows smaller than this in every column are added up in one.
SMALLEST_ROW_US = 0.5


def cpu_per_reconcile(report):
    """Each role's CPU per reconcile (µs) in the recorded phase, from the
    bench's throughput table: 'client / proxy / plugin', proxy wanted."""
    found = {}
    for line in report.split("\n"):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 9 or cells[0] != "1 KiB" or cells[1] != "1":
            continue
        for role, label in THROUGHPUT_ROWS.items():
            if cells[2] == label:
                proxy = cells[8].split("/")[1]
                found[role] = float(proxy.replace("µs", "").replace(",", "").strip())
    return found


def where(symbol, dso):
    """The part of the program a sampled function belongs to."""
    if "kernel" in dso:
        return "the kernel"
    if "vdso" in dso or symbol.startswith("__vdso"):
        return "clock reads (vDSO)"
    if ALLOCATOR.match(symbol) or "jemalloc" in symbol:
        return "the allocator"
    if "libc" in dso:
        return f"libc: {symbol.split('@')[0]}"
    if symbol.startswith("ring_core_"):
        return "ring"
    if re.match(r"^__(u?div|u?mod|popcount|float|fix)", symbol):
        return "compiler builtins"
    dropped = re.match(r"core::ptr::drop_in_place<(.*)>$", symbol)
    if dropped:  # the dropped type's own code, inlined
        return where(dropped.group(1), dso)
    name = GENERIC_IMPL.sub("", symbol)
    name = re.sub(r"^(<|&|mut |dyn )+", "", name)
    crate = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", name)
    if not crate:
        return "other"
    crate = crate.group(1)
    return "Rust's core, alloc, std" if crate in RUST_STD else crate


def read_samples(path, role_of):
    """(role, symbol, dso) of each sample of a known process; a line is
    "PID IP SYMBOL (DSO)"."""
    samples = []
    for line in open(path, errors="replace"):
        match = re.match(r"\s*(\d+)\s+[0-9a-f]+ (.*) \((.*)\)$", line)
        if match and match.group(1) in role_of:
            samples.append((role_of[match.group(1)], match.group(2), match.group(3)))
    return samples


def cpu_ticks(path):
    """ROLE -> user + system clock ticks, from lines "ROLE TICKS"."""
    return {role: int(value) for role, value in (line.split() for line in path.read_text().split("\n") if line)}


def per_reconcile(samples, per_sample, key):
    """µs per reconcile of each role, by `key(symbol, dso)`, where each
    of a role's samples stands for `per_sample[role]` µs."""
    counts = collections.defaultdict(collections.Counter)
    for role, symbol, dso in samples:
        counts[role][key(symbol, dso)] += 1
    return {
        role: {name: per_sample[role] * n for name, n in counted.items()}
        for role, counted in counts.items()
        if role in per_sample
    }


def table(title, rows, roles, limit=None):
    print(f"#### {title}\n")
    print("| | " + " | ".join(f"{role} µs" for role in roles) + " | kplug − relay |")
    print("|---|" + "---:|" * (len(roles) + 1))
    names = set().union(*(rows[role] for role in roles))
    if limit:  # kplug's largest
        ordered = sorted(names, key=lambda n: -rows["kplug"].get(n, 0))[:limit]
    else:  # what kplug spends beyond the relay, largest first
        ordered = sorted(names, key=lambda n: -(rows["kplug"].get(n, 0) - rows["relay"].get(n, 0)))
    rest = {role: 0.0 for role in roles}
    for name in ordered:
        values = [rows[role].get(name, 0.0) for role in roles]
        if not limit and max(values) < SMALLEST_ROW_US:
            for role, value in zip(roles, values):
                rest[role] += value
            continue
        difference = rows["kplug"].get(name, 0.0) - rows["relay"].get(name, 0.0)
        cells = " | ".join(f"{value:.1f}" for value in values)
        print(f"| {name.replace('|', '&#124;')} | {cells} | {difference:+.1f} |")
    if not limit:
        cells = " | ".join(f"{rest[role]:.1f}" for role in roles)
        difference = rest["kplug"] - rest["relay"]
        print(f"| everything under {SMALLEST_ROW_US} µs in every column | {cells} | {difference:+.1f} |")
        totals = " | ".join(f"**{sum(rows[role].values()):.0f}**" for role in roles)
        difference = sum(rows["kplug"].values()) - sum(rows["relay"].values())
        print(f"| **all** | {totals} | **{difference:+.0f}** |")
    print()


def phase(title, samples, per_sample):
    roles = [role for role in ("kplug", "baseline", "relay") if role in per_sample]
    missing = [role for role in roles if not any(sample[0] == role for sample in samples)]
    if missing:
        sys.exit(f"{title}: no samples of {', '.join(missing)}")
    print(f"### {title}\n")
    table("By crate", per_reconcile(samples, per_sample, where), roles)
    by_symbol = per_reconcile(samples, per_sample, lambda symbol, _: symbol[:100])
    table(f"kplug's {SYMBOLS_SHOWN} busiest functions", by_symbol, roles, SYMBOLS_SHOWN)


def main():
    directory = Path(sys.argv[1])
    role_of = {}
    for line in (directory / "pids").read_text().split("\n"):
        if line:
            role, pid = line.split()
            role_of[pid] = role
    recording = dict(line.split() for line in (directory / "recording").read_text().split("\n") if line)
    frequency, calls = int(recording["frequency"]), int(recording["sequential_calls"])

    # One at a time: scaled to each process's CPU time over the phase
    # (/proc), in which every call of its route fell, untimed ones included.
    ticks = int(recording["clock_ticks"])
    used = {
        role: (cpu_ticks(directory / "sequential.cpu-after")[role]
               - cpu_ticks(directory / "sequential.cpu-before")[role]) / ticks
        for role in set(role_of.values())
    }
    samples = read_samples(directory / "sequential.samples", role_of)
    counted = collections.Counter(sample[0] for sample in samples)
    per_sample = {role: used[role] * 1e6 / calls / counted[role] for role in used if counted[role]}
    checks = ", ".join(
        f"{role} {used[role] * 1e6 / calls:.0f} µs (perf: {counted[role] * 1e6 / frequency / calls:.0f})"
        for role in sorted(per_sample)
    )
    phase(f"One call at a time, 1 KiB ({calls:,} calls per route; CPU per call: {checks})",
          samples, per_sample)

    # 32 in flight: scaled to the bench's own CPU per reconcile over the
    # timed calls, which the untimed warm-up shares in proportion.
    cpu = cpu_per_reconcile((directory / "reconcile.md").read_text())
    if not {"kplug", "relay"} <= cpu.keys():
        sys.exit("the bench's report has no 1 KiB, 1-connection row for kplug and the relay")
    samples = read_samples(directory / "throughput.samples", role_of)
    counted = collections.Counter(sample[0] for sample in samples)
    per_sample = {role: cpu[role] / counted[role] for role in cpu if counted[role]}
    phase("32 in flight over one connection, 1 KiB", samples, per_sample)


if __name__ == "__main__":
    main()
