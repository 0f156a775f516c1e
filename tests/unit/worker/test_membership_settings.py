"""Static membership settings and the default transactional id derived from them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.settings import WorkerSettings


def _settings(**values: object) -> WorkerSettings:
    return WorkerSettings.model_validate(values)


def test_no_instance_id_by_default() -> None:
    assert _settings().group_instance_id is None


def test_an_empty_instance_id_means_unset() -> None:
    """A manifest that sets the variable to nothing asks for dynamic membership."""
    assert _settings(group_instance_id="").group_instance_id is None
    assert _settings(group_instance_id="  ").group_instance_id is None


@pytest.mark.parametrize("name", ["kembed-worker-0", "a", "w.1_x-Y", "x" * 249])
def test_instance_ids_kafka_accepts(name: str) -> None:
    assert _settings(group_instance_id=name).group_instance_id == name


@pytest.mark.parametrize("name", ["has space", "slash/ed", "x" * 250, "colon:0"])
def test_instance_ids_kafka_refuses_are_refused_at_start(name: str) -> None:
    with pytest.raises(ValidationError, match="group_instance_id"):
        _settings(group_instance_id=name)


def test_the_default_transactional_id_is_stable_per_group_instance() -> None:
    """A restarted worker (same group, same instance id) gets its predecessor's id, so its
    producer fences the predecessor; other instances or groups get other ids."""
    first = _settings(group_id="g", group_instance_id="kembed-worker-0")
    restarted = _settings(group_id="g", group_instance_id="kembed-worker-0")
    other = _settings(group_id="g", group_instance_id="kembed-worker-1")
    other_group = _settings(group_id="h", group_instance_id="kembed-worker-0")
    assert first.resolved_transactional_id() == "kembed-g-kembed-worker-0"
    assert restarted.resolved_transactional_id() == first.resolved_transactional_id()
    assert other.resolved_transactional_id() != first.resolved_transactional_id()
    assert other_group.resolved_transactional_id() != first.resolved_transactional_id()


def test_without_an_instance_id_every_start_gets_its_own_transactional_id() -> None:
    settings = _settings(group_id="g")
    ids = {settings.resolved_transactional_id() for _ in range(3)}
    assert len(ids) == 3
    assert all(i.startswith("kembed-g-") for i in ids)  # the documented ACL prefix


def test_a_transactional_id_setting_wins() -> None:
    settings = _settings(group_instance_id="kembed-worker-0", transactional_id="mine")
    assert settings.resolved_transactional_id() == "mine"
