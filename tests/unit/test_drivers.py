"""The driver seam: ``driver:`` selects how policies are arranged around ``rl_step`` (default ``single``), the CLI
and the Python API go through ``api.run``, and a driver's declared refusals are one-line load errors."""

import dataclasses
from typing import ClassVar

import pytest

from groupwise import api
from groupwise.catalog import support
from groupwise.config import load
from groupwise.drivers import DRIVERS, DriverRun
from groupwise.registry import ConfigError


@pytest.fixture
def echo_driver():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class EchoConfig:
        REFUSES: ClassVar[dict[str, str]] = {"vllm": "it echoes", "torchrun": "one process"}
        tag: str = "x"

    def echo(run: DriverRun, cfg: EchoConfig) -> dict:
        return {"echo": {"tag": cfg.tag, "resume": run.resume, "steps": run.cfg.trainer.steps}}

    DRIVERS.register("echo_test", EchoConfig)(echo)
    yield DRIVERS.get("echo_test")
    DRIVERS._entries.pop("echo_test")


def test_the_default_driver_is_single():
    cfg = load(None)
    assert cfg.driver.name == "single" and cfg.driver in cfg.specs()
    assert support(DRIVERS.get("single")) == {"vllm": "yes", "ray": "yes", "async": "yes"}


def test_run_calls_the_selected_driver_with_its_config(echo_driver):
    cfg = load(None, ["driver.name=echo_test", "driver.tag=y", "trainer.steps=3"])
    assert api.run(cfg, resume=True) == {"echo": {"tag": "y", "resume": True, "steps": 3}}


def test_a_declared_refusal_is_a_one_line_load_error(echo_driver):
    assert support(echo_driver) == {"vllm": "no: it echoes", "ray": "yes", "async": "yes"}
    with pytest.raises(ConfigError, match=r"^driver: driver 'echo_test' does not run with vllm: it echoes$"):
        load(None, ["driver=echo_test", "rollout.generator=vllm"])


def test_an_unknown_driver_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown driver 'singel' \(did you mean 'single'\?\); valid: .*single"):
        load(None, ["driver=singel"])


def test_a_driver_that_refuses_several_processes_says_so_when_the_run_starts(echo_driver, monkeypatch):
    cfg = load(None, ["driver=echo_test"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"^driver: driver 'echo_test' does not run with torchrun: one process$"):
        api.run(cfg)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert api.run(cfg)["echo"]["tag"] == "x"
