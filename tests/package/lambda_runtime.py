"""A stand-in for AWS Lambda's Python runtime, run as a script in a fresh
interpreter (``python -I -S -B``: no site-packages, no user site, no
environment paths, no bytecode writes).

It does what the runtime does with a function: puts the task root (the
unpacked ``deployment.zip``, ``/var/task`` on AWS) first on ``sys.path``,
imports the module of the function's ``Handler`` setting once (the init
phase of a cold start), then calls the handler with each event and a
LambdaContext-like object (the first call is the cold invocation, every later
one runs warm in the same interpreter).

Standard library only. Reads its job as JSON on stdin, ``{"task_root",
"handler", "function_name", "memory_mb", "timeout_s", "invocations":
[{"event", "request_id"}], "results"}``, and writes its results to the file
named by ``results`` (stdout belongs to the function: its log lines). Each
result is ``{"request_id", "response" | "error", "ms"}``; the file also says
where every imported module came from.
"""
import importlib
import json
import os
import sys
import sysconfig
import time
import traceback


class LambdaContext:
    """The attributes and method of the runtime's context object."""

    def __init__(self, request_id, function_name, memory_mb, timeout_s):
        self.aws_request_id = request_id
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = str(memory_mb)
        self.invoked_function_arn = (
            f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}")
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "2024/05/01/[$LATEST]00000000000000000000000000000000"
        self.identity = None
        self.client_context = None
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self):
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _origin(module):
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path else None


def main():
    job = json.load(sys.stdin)
    task_root = os.path.realpath(job["task_root"])
    sys.path.insert(0, task_root)
    os.chdir(task_root)
    module_name, _, attr = job["handler"].rpartition(".")
    out = {"sys_path": list(sys.path), "site_imported": "site" in sys.modules,
           "dont_write_bytecode": sys.dont_write_bytecode, "results": []}
    started = time.perf_counter()
    try:
        handler = getattr(importlib.import_module(module_name), attr)
    except BaseException as e:  # noqa: BLE001 - an init failure is the result
        out["init_error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        handler = None
    out["init_ms"] = (time.perf_counter() - started) * 1000
    for inv in job["invocations"] if handler else []:
        context = LambdaContext(inv["request_id"], job["function_name"], job["memory_mb"],
                                job["timeout_s"])
        result = {"request_id": inv["request_id"]}
        started = time.perf_counter()
        try:
            result["response"] = handler(inv["event"], context)
        except BaseException as e:  # noqa: BLE001 - the runtime reports it as the result
            result["error"] = {"errorType": type(e).__name__, "errorMessage": str(e),
                               "stackTrace": traceback.format_exc()}
        result["ms"] = (time.perf_counter() - started) * 1000
        out["results"].append(result)
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    # every module but this runtime itself (Lambda's bootstrap is not the bundle's)
    out["modules"] = {name: _origin(m) for name, m in list(sys.modules.items())
                      if name not in ("__main__", "__mp_main__")}
    out["stdlib"] = sorted(stdlib)
    with open(job["results"], "w") as f:
        json.dump(out, f, default=str)


if __name__ == "__main__":
    main()
