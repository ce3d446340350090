"""The private kombu members Keel relies on (``tasks.platform.kombu_members``) are there, as Keel
uses them, in the installed kombu; and Keel overrides no kombu member that list leaves out."""

from __future__ import annotations

import inspect

import pytest

from tasks.platform import kombu_members, transport


def _params(member: object) -> tuple[str, ...]:
    return tuple(inspect.signature(member).parameters)  # type: ignore[arg-type]


METHODS = [*kombu_members.OVERRIDDEN.items(), *kombu_members.CALLED.items()]


@pytest.mark.parametrize(
    ("where", "params"), METHODS, ids=[f"{cls.__name__}.{name}" for (cls, name), _ in METHODS]
)
def test_each_method_keel_relies_on_takes_the_parameters_it_uses(where, params):
    cls, name = where
    member = getattr(cls, name, None)
    assert callable(member), f"kombu's {cls.__name__} has no {name} any more"
    assert _params(member)[: len(params)] == params, f"{cls.__name__}.{name}: {_params(member)}"


@pytest.mark.parametrize(
    ("cls", "name"),
    [(cls, name) for cls, names in kombu_members.ATTRIBUTES.items() for name in names],
)
def test_each_instance_attribute_keel_reads_is_set_by_kombu(cls, name):
    sources = "".join(
        inspect.getsource(base) for base in cls.__mro__ if base.__module__.startswith("kombu")
    )
    assert f"self.{name} =" in sources or f"self.{name}=" in sources, f"{cls.__name__}.{name}"


@pytest.mark.parametrize(
    ("cls", "name"),
    [(cls, name) for cls, names in kombu_members.PROPERTIES.items() for name in names],
)
def test_each_property_keel_reads_is_kombus(cls, name):
    assert isinstance(inspect.getattr_static(cls, name), property)


def test_keel_overrides_no_kombu_member_the_list_leaves_out():
    listed = set(kombu_members.OVERRIDDEN)
    pairs = (
        (transport.Channel, transport.kombu_redis.Channel),
        (transport.QoS, transport.kombu_redis.QoS),
    )
    found = [
        f"{ours.__name__}.{name}"
        for ours, base in pairs
        for name, value in vars(ours).items()
        if ((callable(value) and not isinstance(value, type)) or isinstance(value, property))
        and not name.startswith("__")
        and hasattr(base, name)
        and (base, name) not in listed
        and name not in kombu_members.PROPERTIES.get(base, ())
    ]
    assert found == []
