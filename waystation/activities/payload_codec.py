"""Payload encryption: prompts, tool arguments and results are AES-GCM ciphertext in history.

Keys come from settings (`WAYSTATION_ENCRYPTION_KEYS`, base64 32-byte keys by id, and
`WAYSTATION_ENCRYPTION_KEY_ID`, the one new payloads use). Each payload names its key id in
its metadata, so rotating means adding a key, making it active, and keeping the old ones
for as long as histories encrypted with them must be read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Literal, Self

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    DefaultPayloadConverter,
    FailureConverter,
    JSONPlainPayloadConverter,
    PayloadCodec,
    PayloadConverter,
    SerializationContext,
    WithSerializationContext,
)
from temporalio.exceptions import FailureError

from waystation.settings import Settings
from waystation.workflows.models import FailureDetail

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_NONCE_BYTES = 12
# How a payload this side cannot decrypt is told; only the sentence crosses from a worker
# (a failed workflow task or query) to a client, so clients recognise it by these words.
UNKNOWN_KEY = "payload encrypted with unknown key"
WRONG_KEY = "payload does not decrypt with key"
DISAGREE = "disagree about encryption"

Side = Literal["worker", "client"]
_WHO = {"worker": "the worker", "client": "this client"}
_FIX = {
    "worker": "give the worker the clients' WAYSTATION_ENCRYPTION_KEYS",
    "client": "set the workers' WAYSTATION_ENCRYPTION_KEYS here too",
}
# Tasks a worker with keys was sent a payload in plaintext by (said once each, see decode).
_PLAINTEXT_TOLD_MAX = 10_000
logger = logging.getLogger("waystation.codec")


class UndecryptablePayloadError(ValueError):
    """A payload this side cannot decrypt; the message says why in one sentence, naming key
    ids (never key material) and which side lacks which key."""


class EncryptionCodec(PayloadCodec, WithSerializationContext):
    """AES-256-GCM over each whole payload (its metadata included). Without keys (encryption
    off) payloads pass through, and an encrypted one is refused with a sentence instead of
    the SDK's "Unknown payload encoding"."""

    def __init__(
        self,
        keys: Mapping[str, bytes],
        active_key_id: str | None,
        *,
        side: Side = "client",
        task_id: str | None = None,
    ) -> None:
        if active_key_id is not None and active_key_id not in keys:
            raise ValueError(f"the active encryption key {active_key_id!r} is not among the keys")
        if active_key_id is None and keys:
            raise ValueError("encryption keys without an active one")
        for key_id, key in keys.items():
            if len(key) != 32:
                raise ValueError(f"encryption key {key_id!r} must be 32 bytes, not {len(key)}")
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self._active = active_key_id
        self._side: Side = side
        self._task_id = task_id
        self._plaintext_told: set[str] = set()

    @property
    def encrypts(self) -> bool:
        """Whether this side encrypts what it writes (it holds an active key)."""
        return self._active is not None

    @classmethod
    def without_keys(cls, side: Side = "client") -> EncryptionCodec:
        return cls({}, None, side=side)

    def _copy(self, side: Side, task_id: str | None) -> EncryptionCodec:
        twin = object.__new__(type(self))  # the ciphers and what was said once are shared
        twin.__dict__.update(self.__dict__)
        twin._side, twin._task_id = side, task_id
        return twin

    def on_side(self, side: Side) -> EncryptionCodec:
        """This codec in a worker or a client: what its refusals say about who lacks a key."""
        return self._copy(side, self._task_id)

    def with_context(self, context: SerializationContext) -> EncryptionCodec:
        return self._copy(self._side, getattr(context, "workflow_id", None) or None)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if self._active is None:
            return list(payloads)
        cipher = self._ciphers[self._active]
        encoded = []
        for payload in payloads:
            nonce = os.urandom(_NONCE_BYTES)
            sealed = cipher.encrypt(nonce, payload.SerializeToString(), None)
            encoded.append(
                Payload(
                    metadata={"encoding": ENCODING, KEY_ID: self._active.encode()},
                    data=nonce + sealed,
                )
            )
        return encoded

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        decoded = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                self._plaintext_received()
                decoded.append(payload)  # written before encryption was on, or by a side without
                continue
            key_id = payload.metadata.get(KEY_ID, b"").decode()
            cipher = self._ciphers.get(key_id)
            if cipher is None:
                raise UndecryptablePayloadError(self._refusal(key_id))
            nonce, sealed = payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:]
            try:
                opened = cipher.decrypt(nonce, sealed, None)
            except InvalidTag:
                raise UndecryptablePayloadError(
                    f"{WRONG_KEY} {key_id!r}: the key with that id changed, or the payload did"
                ) from None
            decoded.append(Payload.FromString(opened))
        return decoded

    def _refusal(self, key_id: str) -> str:
        who = _WHO[self._side]
        of_task = f" of task {self._task_id!r}" if self._task_id else ""
        if not self._ciphers:
            return (
                f"{who} has no encryption keys, but a payload{of_task} is encrypted with key "
                f"{key_id!r}: the worker and the client {DISAGREE}; {_FIX[self._side]}"
            )
        held = ", ".join(repr(k) for k in sorted(self._ciphers))
        return f"{UNKNOWN_KEY} {key_id!r}{of_task}: {who} holds {held} only"

    def _plaintext_received(self) -> None:
        """A worker that encrypts was sent a payload in plaintext: by a client without keys,
        which cannot read what the task writes (or the task predates encryption). Said once
        per task; the client that cannot read says so itself."""
        task = self._task_id
        if self._side != "worker" or self._active is None or not task:
            return
        if task in self._plaintext_told or len(self._plaintext_told) >= _PLAINTEXT_TOLD_MAX:
            return
        self._plaintext_told.add(task)
        logger.warning(
            "task %r was sent a payload that is not encrypted, though the worker encrypts "
            "with key %r: the worker and the client %s (a client without "
            "WAYSTATION_ENCRYPTION_KEYS sent it, and cannot read what the task writes), or "
            "the task predates encryption",
            task,
            self._active,
            DISAGREE,
        )


def parse_keys(encoded: Mapping[str, str]) -> dict[str, bytes]:
    keys = {}
    for key_id, text in encoded.items():
        try:
            keys[key_id] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as err:
            raise ValueError(f"encryption key {key_id!r} is not base64") from err
    return keys


def new_key() -> str:
    """A fresh key, base64, for WAYSTATION_ENCRYPTION_KEYS."""
    return base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()


_PYDANTIC_JSON = PydanticJSONPlainPayloadConverter()


class PydanticPayloads(CompositePayloadConverter):
    """Temporal's pydantic payload converter, with one JSON converter for all its instances.

    The SDK builds a data converter for every workflow activation it decodes and every
    completion it encodes, and so a payload converter of this class each time, that it
    then does not use (four a step). The pydantic one builds a serializer and a cache of
    type adapters each time: 20 us against 6 us here. Same encodings, same bytes.
    """

    def __init__(self) -> None:
        super().__init__(
            *(
                _PYDANTIC_JSON if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


class ContextualDataConverter(DataConverter):
    """The SDK's data converter, but put in a serialization context by a shallow copy.

    The SDK puts the converter in a context for each activity a workflow schedules or
    resolves, and this codec takes the context (it names the task in what it refuses). The
    SDK's clone runs `__post_init__`, which builds a payload converter and a failure
    converter only to replace them: 11 us a time against 3 us here (~20 times a step).
    The components that take a context are the SDK's four (its `with_context` names them).
    """

    _CONTEXTUAL = ("payload_converter", "payload_codec", "failure_converter", "external_storage")

    def with_context(self, context: SerializationContext) -> Self:
        changed = {
            name: in_context
            for name in self._CONTEXTUAL
            if isinstance(part := getattr(self, name), WithSerializationContext)
            and (in_context := part.with_context(context)) is not part
        }
        if not changed:
            return self
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__, **changed)
        return twin


PYDANTIC_DATA_CONVERTER = ContextualDataConverter(payload_converter_class=PydanticPayloads)


class EncryptedFailureTexts(DefaultFailureConverterWithEncodedAttributes):
    """Temporal's failure converter that moves messages and stack traces into a payload
    (which the codec encrypts), except the sentence of a payload this side cannot decrypt:
    it names key ids only, and must reach a client that asked a query, whose failure
    carries nothing but its message."""

    _plain = DefaultFailureConverter()

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        if _refuses_a_payload(exception):
            self._plain.to_failure(exception, payload_converter, failure)
        else:
            super().to_failure(exception, payload_converter, failure)


def _refuses_a_payload(err: BaseException | None) -> bool:
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, UndecryptablePayloadError):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def data_converter(codec: PayloadCodec | None, side: Side = "client") -> DataConverter:
    """The pydantic converter with the codec (None: encryption off, and an encrypted payload
    refused with a sentence), as a worker or a client uses it. With encryption on, failure
    messages and stack traces are encrypted too (an endpoint's error may quote the prompt):
    Temporal's failure converter moves them into a payload, which the codec encrypts."""
    if codec is None:
        codec = EncryptionCodec.without_keys(side)
    elif isinstance(codec, EncryptionCodec):
        codec = codec.on_side(side)
    failures: type[FailureConverter] = DefaultFailureConverter
    if not isinstance(codec, EncryptionCodec) or codec.encrypts:
        failures = EncryptedFailureTexts
    return dataclasses.replace(
        PYDANTIC_DATA_CONVERTER, payload_codec=codec, failure_converter_class=failures
    )


async def failure_message(converter: DataConverter, failure: Failure) -> str:
    """A failure's message as its side wrote it, decrypted when encryption put it in the
    failure's encoded attributes (Temporal's own field then says "Encoded failure"); a
    message this side cannot decrypt is the sentence saying why."""
    if not failure.HasField("encoded_attributes"):
        return failure.message
    copy = Failure()
    copy.CopyFrom(failure)
    try:
        err = await converter.decode_failure(copy)
    except UndecryptablePayloadError as refused:
        return str(refused)
    return err.message if isinstance(err, FailureError) else str(err)


async def failure_detail(converter: DataConverter, failure: Failure) -> FailureDetail | None:
    """What a failed task's failure carries (its kind, its usage), in either shape (see
    FailureDetail.of); None for another failure, or details this side cannot decode."""
    payloads = failure.application_failure_info.details.payloads
    if not payloads:
        return None
    try:
        details = await converter.decode(payloads)
    except ValueError:  # encrypted with a key this side lacks, or not JSON
        return None
    return FailureDetail.of(details)


def payload_codec(settings: Settings) -> EncryptionCodec | None:
    """The deployment's encryption codec, or None when no key is configured."""
    if not settings.encryption_keys:
        return None
    keys = parse_keys({k: v.get_secret_value() for k, v in settings.encryption_keys.items()})
    active = settings.encryption_key_id or (next(iter(keys)) if len(keys) == 1 else None)
    if active is None:
        raise ValueError("several encryption keys: set WAYSTATION_ENCRYPTION_KEY_ID")
    return EncryptionCodec(keys, active)


def codec_for(settings: Settings, side: Side) -> EncryptionCodec:
    """The codec of a worker or a client: without keys when encryption is off, so that a
    payload encrypted elsewhere is refused with a sentence naming the side and the key."""
    return (payload_codec(settings) or EncryptionCodec.without_keys()).on_side(side)
