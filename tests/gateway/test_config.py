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
        # NaN passed every check (a health task that died quietly, every request a 500), and
        # a zero timeout or interval took every engine down or ran health rounds back to back
        (["--first-byte-timeout-s", "nan"], {}, "first_byte_timeout_s must be a finite"),
        (["--request-timeout-s", "inf"], {}, "request_timeout_s must be a finite"),
        (["--first-byte-timeout-s", "0"], {}, "first_byte_timeout_s must be positive"),
        ([], {"HIVEROUTE_HEALTH_INTERVAL_S": "-1"}, "health_interval_s must be positive"),
        ([], {"HIVEROUTE_EMBEDDED_ENGINES": "0"}, "embedded_engines must be at least 1"),
        ([], {"HIVEROUTE_PORT": "tcp://10.0.0.1:8080"}, "enableServiceLinks"),
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


def test_engines_with_options_in_one_string_and_yaml_nulls(tmp_path: Path) -> None:
    """HIVEROUTE_ENGINE (or a YAML string) with KV-event options was split at every comma, so
    an engine's own options became engines. A YAML null left a key unset where it may be (it
    became the string 'None': a guessable salt secret, 'Bearer None' sent to engines)."""
    env = {"HIVEROUTE_ENGINE": "http://a:8000,events=tcp://a:5557, http://b:8000"}
    specs = load_config(parse([]), env=env).engine_specs
    assert specs == [
        EngineSpec(url="http://a:8000", events="tcp://a:5557"),
        EngineSpec(url="http://b:8000"),
    ]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("salt_secret: null\nengine_api_key: ~\ntokenizer: null\n")
    config = load_config(parse(["--config", str(cfg)]), env={})
    assert config.salt_secret is None and config.engine_api_key is None
    cfg.write_text("port: null\n")
    with pytest.raises(ConfigError, match="port may not be null"):
        load_config(parse(["--config", str(cfg)]), env={})
    cfg.write_bytes(b"port: 8080\nadmin_key: \xff\xfe\n")  # not UTF-8: a traceback before
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(parse(["--config", str(cfg)]), env={})
