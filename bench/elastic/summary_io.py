"""bench/elastic/summary_io.py: what the elastic benchmarks' summaries (churn_summary.py,
rewarm_summary.py, vs_resume_summary.py) share: one way to stop naming what broke, and
reading a run's JSON files. Each script calls set_prog() with its own name first."""
import json
import sys

_prog = "summary"


def set_prog(name):
    global _prog
    _prog = name


def fail(msg):
    print(f"{_prog}: {msg}", file=sys.stderr)
    sys.exit(1)


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def read_jsonl(path):
    """[(line number, object)] of a JSON-lines file; a bad line fails naming path:line."""
    out = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                try:
                    out.append((n, json.loads(line)))
                except ValueError as e:
                    fail(f"{path}:{n}: {e}")
    except OSError as e:
        fail(f"{path}: {e}")
    return out
