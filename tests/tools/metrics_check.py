#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""metrics_check.py — what an admin checks of malld's metrics and history, with real parts: a real
malld (--metrics-file, affinity backend on cpus 0-1, so it needs no root), real jobs under
mallrun (mall_test_client: one that steps and acks, one that never steps, so a shrink times out),
Prometheus' own parser (Debian's python3-prometheus-client) on both `mallctl metrics` and the
file, every value compared with `mallctl status --json`; then `mallctl history` after the jobs
end, and the node's totals across a malld restart, also for a job that ends while malld is down.
Bad flags exit 2 and change nothing.

Usage: metrics_check.py BIN_DIR      (exit 0 pass, 1 fail; a 300 s watchdog fails a hang)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # a skip, never a pass: run-tests.sh lists it and CI fails on it
    why = f"Prometheus' Python parser is missing ({e}); install python3-prometheus-client"
    if os.environ.get("MALL_TEST_SKIP_LOG"):
        with open(os.environ["MALL_TEST_SKIP_LOG"], "a") as log:
            log.write(f"SKIPPED metrics {why}\n")
    print(f"metrics_check: SKIP: {why}", file=sys.stderr)
    sys.exit(77)

BIN = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="mall-metrics-check.")
SOCKET = os.path.join(TMP, "malld.sock")
PROM = os.path.join(TMP, "mall.prom")
HISTORY = os.path.join(TMP, "malld.history.jsonl")
children = []


MALLD_LOG = os.path.join(TMP, "malld.log")


def fail(what):
    print(f"metrics_check: FAIL: {what}", file=sys.stderr)
    try:  # what malld said last, to see why
        with open(MALLD_LOG) as log:
            print("--- malld's log (tail):\n" + "".join(log.readlines()[-20:]), file=sys.stderr)
    except OSError:
        pass
    sys.exit(1)


def check(condition, what):
    if not condition:
        fail(what)


def watchdog(signum, frame):
    fail("watchdog: the test took more than 300 s")


def start(argv, **kw):
    proc = subprocess.Popen(argv, **kw)
    children.append(proc)
    return proc


def malld_argv():
    return [f"{BIN}/malld", "--socket", SOCKET, "--state-dir", TMP, "--backend", "affinity", "--cpus", "0-1",
            "--ack-timeout-ms", "500", "--metrics-file", PROM, "--metrics-interval", "1",
            "--log-level", "warn"]


def mallctl(*args, check_rc=True):
    r = subprocess.run([f"{BIN}/mallctl", "--socket", SOCKET, *args], capture_output=True, text=True,
                       timeout=30)
    if check_rc and r.returncode != 0:
        fail(f"mallctl {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def status():
    return json.loads(mallctl("status", "--json").stdout)


def job(status_object, name):
    for j in status_object["jobs"]:
        if j["job"] == name:
            return j
    fail(f"no job {name} in mallctl status: {status_object['jobs']}")


def families(text):
    """name -> {labels tuple -> value}; samples keyed by their full name (with _bucket etc.)."""
    out = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            out.setdefault(sample.name, {})[labels] = sample.value
    return out, types


def value(samples, name, **labels):
    key = tuple(sorted((k, str(v)) for k, v in labels.items()))
    if name not in samples or key not in samples[name]:
        fail(f"no sample {name}{labels}; have {sorted(samples.get(name, {}).keys())}")
    return samples[name][key]


def wait_for(predicate, what, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)
    fail(f"timed out waiting for {what}")


def start_malld():
    with open(MALLD_LOG, "a") as log:  # a file, never a pipe nobody reads (malld would block)
        proc = start(malld_argv(), stderr=log)
    wait_for(lambda: os.path.exists(SOCKET) and mallctl("status", check_rc=False).returncode == 0,
             "malld to serve")
    return proc


def stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def main():
    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(300)

    # Bad flags: exit 2 with words, nothing written.
    for bad, words in ((["--metrics-file", "/nonexistent-folder/x.prom"], "does not exist"),
                       (["--metrics-interval", "0"], "between 1 and 3600"),
                       (["--history-file", TMP + "/"], "must name a file"),
                       (["--history-max-mib", "0"], "between 1 and 4096"),
                       (["--checkpoint-interval", "3601"], "between 1 and 3600")):
        r = subprocess.run([f"{BIN}/malld", "--socket", SOCKET, "--state-dir", TMP, "--backend", "affinity",
                            *bad],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and words in r.stderr, f"malld {bad}: exit {r.returncode}, {r.stderr!r}")
    check(not os.path.exists(SOCKET), "a refused malld left its socket")

    malld = start_malld()
    client = f"{BIN}/mall_test_client"
    # "lazy" never steps: it holds both cpus alone, then cannot acknowledge its shrink.
    lazy = start([f"{BIN}/mallrun", "--socket", SOCKET, "--malleable=1:2", "--job", "lazy", "--",
                  client, "--threads", "2", "--no-step", "--duration-s", "60"],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: any(j["job"] == "lazy" and j["ncpus"] == 2 and j["attached"] == 1
                         for j in status()["jobs"]), "lazy to hold 2 cpus")
    busy = start([f"{BIN}/mallrun", "--socket", SOCKET, "--malleable=1:2", "--job", "busy", "--",
                  client, "--threads", "1", "--step-us", "2000", "--duration-s", "60"],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: any(j["job"] == "lazy" and j["ack_timeouts"] >= 1 for j in status()["jobs"]),
             "lazy's shrink to time out")
    wait_for(lambda: any(j["job"] == "busy" and j["ncpus"] == 1 and j["attached"] == 1
                         for j in status()["jobs"]), "busy to hold a cpu")
    # busy acknowledges a change: the signal-control switch publishes its cpus anew.
    mallctl("set", "busy", "--signal-control", "on")
    wait_for(lambda: job(status(), "busy")["ack_latency_seconds"]["count"] >= 1, "busy's ack")
    time.sleep(1.2)  # both jobs now hold their cpus a while: core-seconds accrue

    before = status()
    text = mallctl("metrics").stdout
    after = status()
    samples, types = families(text)

    # Gauges equal the status; counters lie between the status before and after.
    check(value(samples, "mall_pool_cpus") == 2, "mall_pool_cpus")
    check(value(samples, "mall_jobs") == len(after["jobs"]) == 2, "mall_jobs")
    check(value(samples, "mall_free_cpus") == 0, "mall_free_cpus")
    check(types["mall_lent_core_seconds"] == "counter", f"lent core-seconds is a {types['mall_lent_core_seconds']}")
    check(types["mall_job_ack_latency_seconds"] == "histogram", "ack latency is a histogram")
    for name in ("lazy", "busy"):
        b, a = job(before, name), job(after, name)
        uid = str(a["uid"])
        check(uid == str(os.getuid()), f"{name}'s uid label {uid}")
        labels = {"mall_job": name, "uid": uid}
        check(value(samples, "mall_job_cpus", **labels) == a["ncpus"] == 1, f"{name}: mall_job_cpus")
        check(value(samples, "mall_job_lent_cpus", **labels) == a["lent_cpus"] == 0, f"{name}: lent cpus")
        check(value(samples, "mall_job_min_cpus", **labels) == 1 and value(samples, "mall_job_max_cpus", **labels) == 2,
              f"{name}: min/max")
        for metric, field in (("mall_job_lent_core_seconds_total", "lent_core_seconds"),
                              ("mall_job_core_seconds_total", "core_seconds"),
                              ("mall_job_resizes_total", "transitions"),
                              ("mall_job_ack_timeouts_total", "ack_timeouts"),
                              ("mall_job_oversubscribed_seconds_total", "oversubscribed_seconds")):
            v = value(samples, metric, **labels)
            check(b[field] <= v <= a[field], f"{name}: {metric} {v} not within the status's {b[field]}..{a[field]}")
        count = value(samples, "mall_job_ack_latency_seconds_count", **labels)
        check(count == a["ack_latency_seconds"]["count"], f"{name}: ack count {count}")
        check(value(samples, "mall_job_ack_latency_seconds_bucket", le="+Inf", **labels) == count,
              f"{name}: +Inf bucket")
    # lazy held both cpus (one lent) before busy came: its lent core-seconds are above zero.
    check(value(samples, "mall_job_lent_core_seconds_total", mall_job="lazy", uid=str(os.getuid())) > 0,
          "lazy lent core-seconds")
    # lazy timed out on a shrink from 2 threads to 1 cpu: oversubscribed, and still so.
    check(value(samples, "mall_job_ack_timeouts_total", mall_job="lazy", uid=str(os.getuid())) >= 1, "lazy timeouts")
    check(value(samples, "mall_job_oversubscribed", mall_job="lazy", uid=str(os.getuid())) == 1, "lazy oversubscribed")
    check(value(samples, "mall_job_oversubscribed_seconds_total", mall_job="lazy", uid=str(os.getuid())) > 0,
          "lazy oversubscribed seconds")
    # busy acknowledged its changes: latency observed, last latency matches the status.
    busy_labels = {"mall_job": "busy", "uid": str(os.getuid())}
    check(value(samples, "mall_job_ack_latency_seconds_count", **busy_labels) >= 1, "busy acks")
    last = value(samples, "mall_job_last_ack_latency_seconds", **busy_labels)
    check(0 < last < 0.5 and abs(last - job(after, "busy")["last_ack_latency_us"] / 1e6) < 1e-9,
          f"busy last ack latency {last}")
    # Node totals are the sums.
    check(value(samples, "mall_ack_timeouts_total") >= 1, "node ack timeouts")
    node_lent = value(samples, "mall_lent_core_seconds_total")
    check(before["node"]["lent_core_seconds"] <= node_lent <= after["node"]["lent_core_seconds"], "node lent")
    check(value(samples, "mall_ack_latency_seconds_count") == after["node"]["ack_latency_seconds"]["count"],
          "node ack count")
    info = samples["mall_info"]
    check(len(info) == 1 and dict(next(iter(info)))["backend"] == "affinity", f"mall_info {info}")

    # The file: malld rewrites it every second; the same parser reads it, with both jobs.
    def file_with_jobs():
        try:
            with open(PROM) as f:
                s, _ = families(f.read())
        except (OSError, ValueError):
            return None
        return s if s.get("mall_jobs", {}).get((), 0) == 2 else None
    from_file = wait_for(file_with_jobs, "the metrics file to show both jobs")
    check(value(from_file, "mall_job_cpus", **busy_labels) == 1, "the file's mall_job_cpus")
    check(oct(os.stat(PROM).st_mode & 0o777) == "0o644", f"metrics file mode {oct(os.stat(PROM).st_mode)}")
    check(not [f for f in os.listdir(TMP) if ".tmp." in f], "a temporary metrics file was left behind")

    # The jobs end: their records go to the history, with the figures the metrics showed.
    last_busy_lent = value(samples, "mall_job_lent_core_seconds_total", **busy_labels)
    for proc in (busy, lazy):
        stop(proc)
    wait_for(lambda: not status()["jobs"], "both jobs to end")
    records = json.loads(mallctl("history", "--json").stdout)
    names = sorted(r["job"] for r in records)
    check(names == ["busy", "lazy"], f"history holds {names}")
    by_name = {r["job"]: r for r in records}
    check(by_name["busy"]["lent_core_seconds"] >= last_busy_lent, "busy's recorded lent core-seconds")
    check(by_name["lazy"]["ack_timeouts"] >= 1 and by_name["lazy"]["oversubscribed_seconds"] > 0,
          f"lazy's record {by_name['lazy']}")
    check(by_name["busy"]["uid"] == os.getuid() and by_name["busy"]["reason"] in ("exited", "deregistered"),
          f"busy's record {by_name['busy']}")
    check(by_name["busy"]["started"] < by_name["busy"]["time"], "started before ended")
    table = mallctl("history").stdout
    check("busy" in table and "lazy" in table and "2 job(s)" in table, f"history table:\n{table}")
    check("no finished jobs match" in mallctl("history", "--since", str(int(time.time()) + 100)).stdout,
          "--since in the future")
    check(len(json.loads(mallctl("history", "--since", "1h", "--job", "lazy", "--json").stdout)) == 1, "--job")
    bad = mallctl("history", "--since", "yesterday", check_rc=False)
    check(bad.returncode == 2 and "30m" in bad.stderr, f"bad --since: {bad.returncode} {bad.stderr}")
    samples, _ = families(mallctl("metrics").stdout)
    check(value(samples, "mall_jobs_ended_total") == 2, "jobs ended")
    lent_total = value(samples, "mall_lent_core_seconds_total")
    check(lent_total >= node_lent, "the node's lent total went down when the jobs ended")

    # A restart keeps the node's totals; a clean stop removes the metrics file.
    check(stop(malld) == 0, "malld's clean stop")
    check(not os.path.exists(PROM), "the metrics file outlived malld")
    malld = start_malld()
    samples, _ = families(mallctl("metrics").stdout)
    check(value(samples, "mall_jobs_ended_total") == 2, "jobs ended after a restart")
    check(abs(value(samples, "mall_lent_core_seconds_total") - lent_total) < 1e-6, "lent total after a restart")

    # A job that ends while malld is down keeps its figures: the next malld counts it as ended, its
    # record says so, and no counter goes back.
    away = start([f"{BIN}/mallrun", "--socket", SOCKET, "--malleable=1:2", "--job", "away", "--",
                  client, "--threads", "2", "--step-us", "2000", "--duration-s", "60"],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: any(j["job"] == "away" and j["ncpus"] == 2 for j in status()["jobs"]), "away to hold 2 cpus")
    time.sleep(1.0)
    away_pids = job(status(), "away")["pids"]
    samples, _ = families(mallctl("metrics").stdout)
    lent_before_stop = value(samples, "mall_lent_core_seconds_total")
    check(stop(malld) == 0, "malld's clean stop with a job running")
    stop(away, signal.SIGKILL)
    for pid in away_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}/stat") and open(f"/proc/{pid}/stat").read().split()[2] != "Z"
                             for pid in away_pids), "away's processes to end")
    malld = start_malld()
    samples, _ = families(mallctl("metrics").stdout)
    check(value(samples, "mall_jobs_ended_total") == 3, "the job that ended while malld was away is counted")
    lent_after = value(samples, "mall_lent_core_seconds_total")
    check(lent_after >= lent_before_stop, f"lent total went back across the restart: {lent_before_stop} -> {lent_after}")
    records = json.loads(mallctl("history", "--job", "away", "--json").stdout)
    check(len(records) == 1 and records[0]["reason"] == "ended while malld was away" and
          records[0]["lent_core_seconds"] >= 1, f"away's record {records}")
    stop(malld)
    # The history is readable without malld.
    r = subprocess.run([f"{BIN}/mallctl", "--socket", SOCKET, "history", "--file", HISTORY, "--json"],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and len(json.loads(r.stdout)) == 3, f"history --file: {r.returncode} {r.stderr}")
    r = subprocess.run([f"{BIN}/mallctl", "--socket", SOCKET, "history"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 3 and "--file" in r.stderr, f"history without malld: {r.returncode} {r.stderr}")
    print("metrics_check: ok")


if __name__ == "__main__":
    try:
        main()
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(TMP, ignore_errors=True)
