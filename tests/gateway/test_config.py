import argparse
from pathlib import Path

import pytest

from hiveroute.config import RouterConfig, add_config_arguments, load_config
from hiveroute.engines.engine import EngineSpec
from hiveroute.errors import ConfigError


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, RouterConfig)
    return parser.parse_args(argv)


def test_precedence_flag_over_env_over_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 9000\npolicy: least_load\nengines: [http://a:1]\nlog_level: debug\n")
    env = {"HIVEROUTE_PORT": "9100", "HIVEROUTE_ENGINE": "http://b:2,http://c:3"}
    config = load_config(parse(["--config", str(cfg), "--port", "9200"]), env=env)
    assert config.port == 9200
    assert config.engine == ["http://b:2", "http://c:3"]
    assert config.policy == "least_load" and config.log_level == "debug"


def test_repeated_engine_flags_and_event_endpoints() -> None:
    config = load_config(
        parse(["--engine", "http://h:8100,events=tcp://h:5557", "--engine", "http://h:8101"]),
        env={},
    )
    specs = config.engine_specs
    assert specs[0] == EngineSpec(url="http://h:8100", events="tcp://h:5557")
    assert specs[1].events is None and specs[1].name == "h:8101"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "abc"], {}, "port"),
        (["--port", "70000"], {}, "port"),
        ([], {"HIVEROUTE_MAX_BODY_BYTES": "-1"}, "max_body_bytes"),
        (["--engine", "ftp://x"], {}, "http://HOST:PORT"),
        (["--engine", "http://x:1,events=udp://y"], {}, "tcp://"),
        (["--engine", "http://x:1,color=red"], {}, "unknown engine option"),
        (["--log-level", "loud"], {}, "log level"),
        (["--policies", "{not json"], {}, "policies"),
    ],
)
def test_bad_values_say_what_is_wrong(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(parse(argv), env=env)
    assert message in info.value.message


def test_yaml_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("colour: blue\n")
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_config(parse(["--config", str(bad)]), env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(parse(["--config", str(tmp_path / "missing.yaml")]), env={})
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(parse(["--config", str(listy)]), env={})


def test_every_key_is_in_exactly_one_component_group() -> None:
    """`--help` and the README show the keys by component; none may be left out or shown twice."""
    import dataclasses

    from hiveroute.config import CONFIG_GROUPS, RouterConfig

    grouped = [key for keys in CONFIG_GROUPS.values() for key in keys]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == {f.name for f in dataclasses.fields(RouterConfig)}
