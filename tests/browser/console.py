#!/usr/bin/env python3
"""The web console in a real browser (issue 20, item 3).

Starts `stele dev --nodes 3`, opens the console it prints in headless
Chromium (Debian's /usr/bin/chromium, driven by Playwright from PyPI; no
browser download), and checks from the DOM that:

  1. three nodes are shown, all up, and every tablet the controller lists;
  2. a node killed with SIGKILL is marked dead within the controller's
     lease (read from the page) plus a margin, and its tablets
     under-replicated;
  3. a split started with `stele tablet split` shows as a split intent.

It saves a full-page screenshot (default target/console-screenshot.png) and
exits non-zero, saying what it waited for, on any failure. Every wait is
bounded; the whole run is bounded by --deadline-s.

Run by tests/tests/console.rs (which scripts/test runs):
  target/browser-venv/bin/python tests/browser/console.py \
      --stele target/debug/stele --port-base 12000
"""

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from playwright.sync_api import sync_playwright

MARGIN_S = 5.0


def log(msg):
    print(f"[console test {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Dev:
    """A `stele dev --nodes 3` process and the lines it prints."""

    def __init__(self, stele, data_dir, port_base):
        self.stele = stele
        self.data_dir = data_dir
        self.lines = queue.Queue()
        self.seen = []
        self.proc = subprocess.Popen(
            [stele, "dev", "--nodes", "3", "--data-dir", data_dir,
             "--listen", f"127.0.0.1:{port_base}", "--tablets", "4",
             "--election-timeout-ms", "1000"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern, timeout_s):
        """The first match of `pattern` in a line printed from now on (or
        already printed)."""
        rx = re.compile(pattern)
        for line in self.seen:
            m = rx.search(line)
            if m:
                return m
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise SystemExit(f"stele dev exited ({self.proc.returncode}) before /{pattern}/:\n"
                                     + "\n".join(self.seen[-40:]))
                continue
            self.seen.append(line)
            m = rx.search(line)
            if m:
                return m
        raise SystemExit(f"stele dev did not print /{pattern}/ within {timeout_s} s:\n"
                         + "\n".join(self.seen[-40:]))

    def node_pid(self, node):
        """The pid of node `node`'s `stele server` process of this cell."""
        want = f"node-{node}"
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            args = [a.decode(errors="replace") for a in argv]
            if ("server" in args and "--node-id" in args
                    and args[args.index("--node-id") + 1] == str(node)
                    and any(a.startswith(self.data_dir) and a.endswith(want) for a in args)):
                return int(pid)
        raise SystemExit(f"no process of node {node} under {self.data_dir}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cli(stele, *args, timeout_s=20):
    r = subprocess.run([stele, *args], capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"stele {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def wait_dom(page, what, predicate_js, timeout_s, arg=None):
    """Waits until `predicate_js` (a JS function of `arg`) holds in the page."""
    try:
        page.wait_for_function(predicate_js, arg=arg, timeout=timeout_s * 1000, polling=250)
    except Exception as e:  # Playwright's TimeoutError, or the page went away
        raise SystemExit(f"the console never showed {what} within {timeout_s:.0f} s ({type(e).__name__})")


def nodes_in_dom(page):
    return page.eval_on_selector_all(
        "#nodes tr[data-node-id]",
        "rows => rows.map(r => [Number(r.dataset.nodeId), r.dataset.nodeState])")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stele", required=True)
    ap.add_argument("--port-base", type=int, required=True)
    ap.add_argument("--screenshot", default="target/console-screenshot.png")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--deadline-s", type=float, default=110.0)
    a = ap.parse_args()
    started = time.monotonic()

    def remaining():
        left = a.deadline_s - (time.monotonic() - started)
        if left <= 0:
            raise SystemExit(f"over the {a.deadline_s:.0f} s deadline")
        return left

    with tempfile.TemporaryDirectory(prefix="stele-console-") as data_dir:
        dev = Dev(a.stele, data_dir, a.port_base)
        try:
            url = dev.wait_for(r"stele dev: cell console at (http://127\.0\.0\.1:\d+)/", 60).group(1) + "/"
            controller = dev.wait_for(r"cell ready: listening on (http://\S+)", remaining()).group(1)
            log(f"console at {url}, controller at {controller}")
            tablets = json.loads(cli(a.stele, "tablet", "list", "--controllers", controller, "--json"))
            tablets = tablets["tablets"] if isinstance(tablets, dict) else tablets
            ids = sorted(int(t["id"]) for t in tablets)
            assert ids, "the controller lists no tablet"
            # Some load, so the charts have points: appends through the CLI.
            for i in range(20):
                cli(a.stele, "append", "--endpoint", controller, "--namespace", "console/test",
                    "--key", f"k{i}", "--value", "v")

            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=a.chromium, headless=True,
                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url, timeout=20_000)
                wait_dom(page, "a first refresh", "() => document.body.dataset.consoleStatus === 'ok'",
                         min(20, remaining()))

                # 1. Three nodes, up; every tablet.
                wait_dom(page, "three nodes up",
                         "() => [...document.querySelectorAll('#nodes tr[data-node-id]')]"
                         ".filter(r => r.dataset.nodeState === 'up').length === 3",
                         min(20, remaining()))
                shown = nodes_in_dom(page)
                assert sorted(n for n, _ in shown) == [1, 2, 3], f"nodes shown: {shown}"
                wait_dom(page, f"every tablet {ids}",
                         "ids => ids.every(id => document.querySelector(`#tablets tr[data-tablet-id='${id}']`))",
                         min(10, remaining()), arg=ids)
                rows = page.eval_on_selector_all("#tablets tr[data-tablet-id]", "rs => rs.length")
                assert rows == len(ids), f"{rows} tablet rows for tablets {ids}"
                log(f"three nodes up and every tablet {ids} shown")
                wait_dom(page, "an append-rate chart with points",
                         "() => [...document.querySelectorAll(\"canvas[data-chart='appends_per_s']\")]"
                         ".some(c => Number(c.dataset.points) > 0)",
                         min(15, remaining()))
                log("append-rate charts have points")

                # 2. Kill node 3: dead within the lease (+ margin).
                lease_s = int(page.get_attribute("body", "data-lease-ms")) / 1000
                victim = dev.node_pid(3)
                os.kill(victim, signal.SIGKILL)
                killed = time.monotonic()
                log(f"killed node 3 (pid {victim}); lease {lease_s:.0f} s")
                wait_dom(page, "node 3 dead",
                         "() => document.querySelector(\"#nodes tr[data-node-id='3']\")"
                         "?.dataset.nodeState === 'dead'",
                         min(lease_s + MARGIN_S, remaining()))
                took = time.monotonic() - killed
                assert took <= lease_s + MARGIN_S, f"marked dead after {took:.1f} s"
                log(f"node 3 marked dead {took:.1f} s after the kill")
                states = dict(nodes_in_dom(page))
                assert states[1] == "up" and states[2] == "up", f"states: {states}"
                wait_dom(page, "node 3's tablets under-replicated",
                         "() => [...document.querySelectorAll('#tablets tr[data-tablet-id]')]"
                         ".filter(r => r.dataset.tabletVoters.split(',').includes('3'))"
                         ".every(r => r.dataset.tabletHealth === 'under-replicated')",
                         min(5, remaining()))

                # 3. A split, seen as an intent.
                target = ids[0]
                out = cli(a.stele, "tablet", "split", str(target), "--controllers", controller)
                log(f"split started: {out.strip()}")
                wait_dom(page, f"a split intent on tablet {target}",
                         "t => document.querySelector("
                         "`#intents tr[data-intent-kind='split'][data-intent-tablet='${t}']`)",
                         min(15, remaining()), arg=target)
                state = page.get_attribute(
                    f"#intents tr[data-intent-kind='split'][data-intent-tablet='{target}']",
                    "data-intent-state")
                log(f"split intent shown ({state})")

                os.makedirs(os.path.dirname(a.screenshot) or ".", exist_ok=True)
                page.screenshot(path=a.screenshot, full_page=True)
                log(f"screenshot: {a.screenshot}")
                browser.close()
        finally:
            dev.stop()
    log(f"passed in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
