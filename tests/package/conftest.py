"""One deployable bundle per session, shared by every test of this folder:
the one `make package` just built (``GPUJOBS_BUNDLE=build/dev``, as `make
test` runs it), else packaged here once."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGE = "dev"


def _package_module():
    spec = importlib.util.spec_from_file_location("gpujobs_infra_package",
                                                  ROOT / "infra" / "package.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Bundle:
    out: pathlib.Path
    sam: dict
    template: dict      # infra/template.yaml, long-form intrinsics
    environment: dict   # the environment every function must get
    names: list[str]    # the zip's entries
    zipped: int
    unzipped: int

    @property
    def resources(self) -> dict:
        return self.sam["Resources"]

    def functions(self) -> dict:
        return {k: v for k, v in self.resources.items()
                if v["Type"] == "AWS::Serverless::Function"}


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> Bundle:
    built = os.environ.get("GPUJOBS_BUNDLE")  # `make test` has just run `make package`
    if built:
        out = pathlib.Path(built).resolve()
        assert (out / "sam.json").is_file() and (out / "deployment.zip").is_file(), out
    else:
        out = tmp_path_factory.mktemp("package") / STAGE
        # its own process: packaging imports app.py with the stage's environment
        done = subprocess.run([sys.executable, str(ROOT / "infra" / "package.py"),
                               "--stage", STAGE, "--out", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"packaging failed:\n{done.stdout}\n{done.stderr}"
    pkg = _package_module()
    template = pkg.load_template()
    with zipfile.ZipFile(out / "deployment.zip") as z:
        infos = z.infolist()
    return Bundle(out=out, sam=json.loads((out / "sam.json").read_text()),
                  template=template, environment=pkg.environment(template),
                  names=[i.filename for i in infos],
                  zipped=(out / "deployment.zip").stat().st_size,
                  unzipped=sum(i.file_size for i in infos))


