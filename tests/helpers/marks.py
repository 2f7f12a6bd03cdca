"""Skip conditions the tests share, each defined once: what a test needs that `make setup` or
`make test` installs, and the message that names the fix."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from rhymerl.config.spec import has_arctic_inference

needs_arctic = pytest.mark.skipif(not has_arctic_inference(),
                                  reason="arctic-inference is not installed (make setup builds it)")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make setup)")


def chromium() -> tuple[str, str]:
    """Headless Chromium's browser and driver paths, or skip the test saying how to install them."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("headless Chromium not found (needs Debian's chromium and chromium-driver; "
                    "`make test` installs them with apt-get)")
    return browser, driver


def docker_compose() -> str:
    """Debian's docker-compose, or skip the test (fail it under CI, where `make setup` installs it)."""
    found = shutil.which("docker-compose")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is missing: `make setup` installs Debian's docker-compose (as root)")
        pytest.skip("Debian's docker-compose is not installed (make setup installs it as root)")
    return found
