"""An image's files rebuilt without Docker, from the Dockerfile's COPY/WORKDIR and the .dockerignore.

Only the subset the project's Dockerfiles use is understood; anything else raises `Unsupported`,
so the parser gets extended instead of being silently wrong.

Dockerfile:
- one instruction per logical line (a trailing backslash continues it), `#` lines are comments;
- `WORKDIR path`: absolute, or relative to the previous WORKDIR (the first is relative to `/`);
- `COPY src... dest` in shell form, without flags (`--from`, `--chown`...), variables or wildcards.
  A directory source copies its contents; a file source lands inside `dest` when `dest` ends with
  `/`, is `.`, or there are several sources, else at `dest` itself. A relative `dest` is relative
  to the WORKDIR. A source missing from the context (or ignored) is an error, as for `docker build`.
- every other instruction (FROM, ENV, RUN, CMD...) is skipped: it installs or configures, but does
  not decide which of the project's files the image holds.

.dockerignore (paths relative to the build context):
- one pattern a line, `#` lines are comments, a leading `/` and a trailing `/` are dropped;
- `*` and `?` match within one path segment, a `**` segment matches any number of segments;
- a pattern matching a directory keeps everything under it out of the context;
- exceptions (`!pattern`) and character classes (`[...]`) are not supported.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from dataclasses import dataclass
from pathlib import Path


class Unsupported(ValueError):
    """A Dockerfile or .dockerignore line outside the subset this module understands."""


@dataclass(frozen=True)
class ImageFiles:
    """The project's files in an image: absolute path in the image -> path in the build context."""

    workdir: str            # the last WORKDIR: where the image's RUN lines (its `pip install .`) run
    files: dict[str, str]

    def without(self, folder: str) -> ImageFiles:
        """The same image with `folder` (relative to the WORKDIR) left out."""
        prefix = posixpath.join(self.workdir, folder.strip("/")) + "/"
        return ImageFiles(self.workdir, {k: v for k, v in self.files.items() if not k.startswith(prefix)})

    def top_level(self) -> set[str]:
        """The names directly under the WORKDIR (folders and files)."""
        root = self.workdir.rstrip("/") + "/"
        return {k[len(root):].split("/")[0] for k in self.files if k.startswith(root)}


# --- .dockerignore ---------------------------------------------------------------------------

def _segment_regex(segment: str) -> str:
    if "[" in segment:
        raise Unsupported(f".dockerignore: character class in {segment!r} (not supported here)")
    return "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in segment)


def pattern_regex(pattern: str) -> re.Pattern:
    """The regex of one .dockerignore pattern, to be matched against a whole context path."""
    segments = posixpath.normpath(pattern.strip()).lstrip("/").split("/")
    out = ""
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            out += ".*" if last else "(?:.*/)?"  # zero or more whole segments
        else:
            out += _segment_regex(segment) + ("" if last else "/")
    return re.compile(out)


def read_dockerignore(path: Path) -> list[re.Pattern]:
    """The patterns of a .dockerignore file (none when it does not exist)."""
    if not path.is_file():
        return []
    patterns = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise Unsupported(f".dockerignore: exception {line!r} (not supported here)")
        patterns.append(pattern_regex(line))
    return patterns


def ignored(rel: str, patterns: list[re.Pattern]) -> bool:
    """Whether context path `rel` (posix, relative) is kept out: it or a parent folder matches."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(p.fullmatch(prefix) for p in patterns for prefix in prefixes)


def context_files(context: Path, patterns: list[re.Pattern]) -> set[str]:
    """Every file (or symlink) of the build context that .dockerignore lets through, as posix paths."""
    found = set()
    for folder, dirs, files in os.walk(context):
        base = Path(folder).relative_to(context).as_posix()
        rel = {name: name if base == "." else f"{base}/{name}" for name in dirs + files}
        dirs[:] = [d for d in dirs if not ignored(rel[d], patterns)]  # an ignored folder is not walked
        linked = [d for d in dirs if (Path(folder) / d).is_symlink()]  # copied as links, as Docker does
        dirs[:] = [d for d in dirs if d not in linked]
        found.update(rel[f] for f in files + linked if not ignored(rel[f], patterns))
    return found


# --- Dockerfile ------------------------------------------------------------------------------

def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each logical line of a Dockerfile."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, args = (pending + line).partition(" ")
        out.append((word.upper(), args.strip()))
        pending = ""
    return out


def _copy(args: str, workdir: str, available: set[str], files: dict[str, str]) -> None:
    """Apply one `COPY src... dest` to `files` (image path -> context path)."""
    if args.startswith(("[", "--")) or any(c in args for c in "$*?["):
        raise Unsupported(f"COPY {args}: flags, JSON form, variables and wildcards are not supported here")
    *sources, dest = args.split()
    target = posixpath.normpath(posixpath.join(workdir, dest))
    into = dest.endswith("/") or dest == "." or len(sources) > 1
    for src in sources:
        src = posixpath.normpath(src).lstrip("/")
        if src == ".":
            under = sorted(available)
        else:
            under = sorted(f for f in available if f.startswith(src + "/"))
        if under:  # a directory: its contents
            cut = 0 if src == "." else len(src) + 1
            files.update({posixpath.join(target, f[cut:]): f for f in under})
        elif src in available:
            files[posixpath.join(target, posixpath.basename(src)) if into else target] = src
        else:
            raise FileNotFoundError(f"COPY {src}: not in the build context (or excluded by .dockerignore)")


def image_files(dockerfile: Path, context: Path) -> ImageFiles:
    """The project's files a `docker build -f dockerfile context` puts in the image."""
    available = context_files(context, read_dockerignore(context / ".dockerignore"))
    workdir, files = "/", {}
    for word, args in instructions(dockerfile.read_text()):
        if word == "WORKDIR":
            if "$" in args:
                raise Unsupported(f"WORKDIR {args}: variables are not supported here")
            workdir = posixpath.normpath(posixpath.join(workdir, args))
        elif word == "COPY":
            _copy(args, workdir, available, files)
    return ImageFiles(workdir, files)


def write_image_files(image: ImageFiles, context: Path, root: Path) -> Path:
    """Copy the image's files under `root` (the image's `/`), modes kept; returns root + WORKDIR."""
    for dest, src in image.files.items():
        path = root / dest.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(context / src, path, follow_symlinks=False)
    return root / image.workdir.lstrip("/")
