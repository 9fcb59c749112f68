"""The closed set of message kinds: wire value, signed name, body type and gossip topic."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import Message

from proto import swarm_pb2


class Kind(enum.IntEnum):
    """Mirror of swarm.v1.Envelope.Kind (a test keeps the two equal). The member NAME is part of
    the signed bytes: renaming a member is a protocol change."""

    ROLLOUT_GROUP = 1
    HINT = 2
    HINT_REQUEST = 3


@dataclass(frozen=True)
class KindSpec:
    kind: Kind
    body_type: type[Message]
    topic: str  # the `kind` part of transport.topic_name()


KIND_SPECS: dict[Kind, KindSpec] = {
    Kind.ROLLOUT_GROUP: KindSpec(Kind.ROLLOUT_GROUP, swarm_pb2.RolloutGroup, "rollouts"),
    Kind.HINT: KindSpec(Kind.HINT, swarm_pb2.Hint, "hints"),
    Kind.HINT_REQUEST: KindSpec(Kind.HINT_REQUEST, swarm_pb2.HintRequest, "hint-requests"),
}

_KIND_OF_BODY_TYPE = {spec.body_type: kind for kind, spec in KIND_SPECS.items()}


def kind_of(message: Message) -> Kind:
    """The kind whose body type `message` is (TypeError for anything else)."""
    try:
        return _KIND_OF_BODY_TYPE[type(message)]
    except KeyError:
        raise TypeError(f"{type(message).__name__} is not a body message of any kind") from None
