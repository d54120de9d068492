"""Settings that do not parse, said in one sentence that never quotes a secret.

pydantic's own message quotes each bad value and the path to it, and the path of a bearer
token's role is the token itself (`api_tokens.<token>.role`). The commands read their
settings through `load_settings`, which names the variable, the place inside it and the
rule broken: never a value, and never a key of a mapping whose keys are secrets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from pydantic import AliasChoices, ValidationError
from pydantic_settings import SettingsError

from waystation.settings import Settings
from waystation.settings.validation import validation_sentence

SECRET_KEYS = {"api_tokens": "<a token>"}  # fields whose mapping keys are secrets
_FIELD_IN_MESSAGE = re.compile(r'field "(\w+)"')


class SettingsProblem(Exception):
    """The environment's settings do not parse; the message is safe to print."""


def load_settings() -> Settings:
    """Settings from the environment, or SettingsProblem saying what is wrong with them."""
    try:
        return Settings()
    except ValidationError as err:
        raise SettingsProblem(settings_sentence(err)) from None
    except SettingsError as err:
        raise SettingsProblem(parse_sentence(err)) from None


def variable_of(field: str) -> str:
    """The environment variable(s) a settings field is read from."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    if isinstance(alias, AliasChoices):
        return " or ".join(str(choice) for choice in alias.choices)
    return f"WAYSTATION_{field.upper()}"


def settings_sentence(err: ValidationError) -> str:
    return "invalid settings: " + validation_sentence(err, place=_variable_place)


def _variable_place(loc: Sequence[str | int]) -> str:
    """Where in the environment a problem is: the variable, and the place inside it (a key
    of a mapping whose keys are secrets is not said)."""
    if not loc:
        return ""
    field, inside = str(loc[0]), [str(part) for part in loc[1:]]
    if inside and field in SECRET_KEYS:
        inside[0] = SECRET_KEYS[field]
    return variable_of(field) + (f" at {'.'.join(inside)}" if inside else "")


def parse_sentence(err: SettingsError) -> str:
    found = _FIELD_IN_MESSAGE.search(str(err))
    variable = variable_of(found.group(1)) if found else "a setting"
    cause = err.__cause__
    where = ""
    if isinstance(cause, json.JSONDecodeError):  # its message quotes no part of the text
        where = f" ({cause.msg} at column {cause.colno})"
    return f"invalid settings: {variable} is not valid JSON{where}"
