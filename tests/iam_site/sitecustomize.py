"""Records the application's AWS calls in the test session's subprocesses.

tests/iam_recorder.py puts this folder on PYTHONPATH and sets IAM_RECORD_DIR
for the session, so Python processes the tests start (the local stack of the
end-to-end tests) import this at start-up. It costs nothing until a process
imports ``botocore.client``: only then is the recorder installed, appending
each new record to ``$IAM_RECORD_DIR/<pid>.jsonl`` as it happens (a process
killed later loses nothing). Outside a test session the variable is unset and
this does nothing.
"""
import os
import sys

if os.environ.get("IAM_RECORD_DIR"):
    import importlib.abc
    import importlib.util

    class _AfterBotocoreClient(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "botocore.client":
                return None
            sys.meta_path.remove(self)  # one shot; and find the real module below
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                try:
                    import pathlib

                    # by path: another top-level "tests" package may come first
                    here = pathlib.Path(__file__).resolve().parent
                    spec = importlib.util.spec_from_file_location(
                        "gpujobs_iam_recorder", here.parent / "iam_recorder.py")
                    recorder = importlib.util.module_from_spec(spec)
                    sys.modules[spec.name] = recorder  # dataclasses look it up
                    spec.loader.exec_module(recorder)
                    recorder.install(pathlib.Path(os.environ["IAM_RECORD_DIR"])
                                     / f"{os.getpid()}.jsonl")
                except Exception:  # noqa: BLE001 - never break the process under test
                    pass

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterBotocoreClient())
