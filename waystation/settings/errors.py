"""Settings that do not parse, said in one sentence that never quotes a secret.

pydantic's own message quotes each bad value and the path to it, and the path of a bearer
token's role is the token itself (`api_tokens.<token>.role`). The commands read their
settings through `load_settings`, which names the variable, the place inside it and the
rule broken: never a value, and never a key of a mapping whose keys are secrets.
"""

from __future__ import annotations

import json
import re

from pydantic import AliasChoices, ValidationError
from pydantic_settings import SettingsError

from waystation.settings import Settings

SECRET_KEYS = {"api_tokens": "<a token>"}  # fields whose mapping keys are secrets
_FIELD_IN_MESSAGE = re.compile(r'field "(\w+)"')


class SettingsProblem(Exception):
    """The environment's settings do not parse; the message is safe to print."""


def load_settings() -> Settings:
    """Settings from the environment, or SettingsProblem saying what is wrong with them."""
    try:
        return Settings()
    except ValidationError as err:
        raise SettingsProblem(validation_sentence(err)) from None
    except SettingsError as err:
        raise SettingsProblem(parse_sentence(err)) from None


def variable_of(field: str) -> str:
    """The environment variable(s) a settings field is read from."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    if isinstance(alias, AliasChoices):
        return " or ".join(str(choice) for choice in alias.choices)
    return f"WAYSTATION_{field.upper()}"


def validation_sentence(err: ValidationError) -> str:
    problems = []
    for error in err.errors(include_input=False, include_url=False):
        loc = [str(part) for part in error["loc"]]
        if not loc:
            problems.append(error["msg"])
            continue
        field, inside = loc[0], loc[1:]
        if inside and field in SECRET_KEYS:
            inside[0] = SECRET_KEYS[field]
        where = f" at {'.'.join(inside)}" if inside else ""
        problems.append(f"{variable_of(field)}{where}: {error['msg']}")
    return "invalid settings: " + "; ".join(problems)


def parse_sentence(err: SettingsError) -> str:
    found = _FIELD_IN_MESSAGE.search(str(err))
    variable = variable_of(found.group(1)) if found else "a setting"
    cause = err.__cause__
    where = ""
    if isinstance(cause, json.JSONDecodeError):  # its message quotes no part of the text
        where = f" ({cause.msg} at column {cause.colno})"
    return f"invalid settings: {variable} is not valid JSON{where}"
