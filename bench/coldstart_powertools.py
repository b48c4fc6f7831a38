"""Cold-start import cost of AWS Powertools (Logger, Metrics) on the real bundle.

    make package && .venv/bin/python bench/coldstart_powertools.py [--runs 30] [--quick]

Unpacks build/<stage>/deployment.zip twice (with the bytecode infra/package.py
adds, and without any), installs the pinned Powertools into copies of each
(pip --target, from the package registry), and times, in fresh interpreters
with no site-packages and bytecode writing off (as on Lambda's read-only file
system), interleaved: ``import boto3, chalice, pynamodb``; the same plus
Powertools ``Logger`` and ``Metrics`` made; ``import app``; and ``import app``
plus Powertools. Prints medians of process CPU time and of wall time.
The numbers in docs/deploy.md come from this.
"""
from __future__ import annotations

import compileall
import pathlib
import py_compile
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

POWERTOOLS = "aws-lambda-powertools==3.37.0"
BASE = "import boto3, chalice, pynamodb"
PT = ("from aws_lambda_powertools import Logger, Metrics\n"
      "log = Logger(service='gpujobs'); m = Metrics(namespace='gpujobs', service='gpujobs')")
PROBE = """
import sys, time
sys.path[:0] = {paths!r}
t, c = time.perf_counter(), time.process_time()
{code}
print(time.perf_counter() - t, time.process_time() - c)
"""


def _trees(zip_path: pathlib.Path, work: pathlib.Path) -> dict[str, pathlib.Path]:
    pt = work / "pt"
    with zipfile.ZipFile(zip_path) as z:
        bundled = [n for n in z.namelist() if n.startswith("aws_lambda_powertools/")
                   or n == "typing_extensions.py"]
        if any(n.startswith("aws_lambda_powertools/") for n in bundled):
            z.extractall(pt, members=bundled)  # the bundle's own copy
        else:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
                            "--disable-pip-version-check", "--target", str(pt), POWERTOOLS],
                           check=True)
    trees = {}
    for bytecode in (True, False):
        for with_pt in (False, True):
            d = work / f"{'pyc' if bytecode else 'src'}-{'pt' if with_pt else 'bare'}"
            with zipfile.ZipFile(zip_path) as z:
                z.extractall(d)
            if not bytecode:
                for cache in list(d.rglob("__pycache__")):
                    shutil.rmtree(cache)
            shutil.rmtree(d / "aws_lambda_powertools", ignore_errors=True)
            if with_pt:
                shutil.copytree(pt / "aws_lambda_powertools", d / "aws_lambda_powertools")
                if not (d / "typing_extensions.py").exists():
                    shutil.copy(pt / "typing_extensions.py", d)
                if bytecode:
                    compileall.compile_dir(
                        d / "aws_lambda_powertools", quiet=2, workers=0,
                        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
                    py_compile.compile(str(d / "typing_extensions.py"), doraise=False,
                                       invalidation_mode=py_compile.PycInvalidationMode
                                       .UNCHECKED_HASH)
            trees[d.name] = d
    return trees


def main() -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--stage", default="dev")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 30)
    zip_path = ROOT / "build" / args.stage / "deployment.zip"
    if not zip_path.exists() and not args.quick:
        raise SystemExit(f"{zip_path} is missing: run `make package` first")
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            import sysconfig

            here = [str(ROOT), sysconfig.get_paths()["purelib"]]
            trees = {k: here for k in ("src-bare", "src-pt", "pyc-bare", "pyc-pt")}
        else:
            trees = {k: [str(v)] for k, v in _trees(zip_path, pathlib.Path(tmp)).items()}
        cases = {}
        for mode in ("src", "pyc"):
            cases[f"{mode}: {BASE}"] = (trees[f"{mode}-bare"], BASE)
            cases[f"{mode}: + Powertools Logger, Metrics"] = (trees[f"{mode}-pt"], BASE + "\n" + PT)
            cases[f"{mode}: import app"] = (trees[f"{mode}-bare"], "import app")
            cases[f"{mode}: import app + Powertools"] = (trees[f"{mode}-pt"], "import app\n" + PT)
        env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
               "AWS_DEFAULT_REGION": "us-east-1"}
        wall: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(runs):
            for name, (paths, code) in cases.items():
                done = subprocess.run([sys.executable, "-S", "-c",
                                       PROBE.format(paths=paths, code=code)],
                                      cwd=paths[0], env=env, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{name}: {done.stderr}")
                w, c = map(float, done.stdout.split())
                wall[name].append(w * 1000)
                cpu[name].append(c * 1000)
    print(f"{POWERTOOLS}, CPython {sys.version.split()[0]}, {runs} runs each, "
          "'src' = no bytecode in the bundle, 'pyc' = unchecked-hash bytecode")
    for name in cases:
        print(f"{name:50s} cpu median {statistics.median(cpu[name]):6.1f} ms   "
              f"wall median {statistics.median(wall[name]):6.1f} ms")
    print(f"powertools-bench: app_ms={statistics.median(cpu['pyc: import app']):.1f} "
          f"app_powertools_ms={statistics.median(cpu['pyc: import app + Powertools']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
