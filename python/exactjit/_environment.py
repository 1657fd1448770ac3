"""exactjit's environment variables on the Python side, read with the library's spellings
(runtime/environment.cpp): a boolean is 1/0, true/false, yes/no or on/off in any case, empty or
unset means its default, and anything else is an error naming the variable and the accepted
values. Used by every os.environ read of an EXACTJIT_* switch in this package."""
import os

ACCEPTED = "1/0, true/false, yes/no, on/off"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_boolean(text):
    """True, False, or None when `text` is not one of the accepted spellings."""
    word = text.lower()
    return True if word in _TRUE else False if word in _FALSE else None


def boolean(name, default=False):
    """The boolean variable `name`; ValueError naming it when malformed."""
    value = os.environ.get(name, "")
    if not value:
        return default
    parsed = parse_boolean(value)
    if parsed is None:
        raise ValueError(f"{name}='{value}' is not valid: use {ACCEPTED}")
    return parsed


def boolean_or_path(name, default=True):
    """A variable that is a boolean or the path of a file: True/False, the path (a value with a
    '/'), or `default` when unset; ValueError naming it for anything else."""
    value = os.environ.get(name, "")
    if not value:
        return default
    parsed = parse_boolean(value)
    if parsed is not None:
        return parsed
    if os.sep in value:
        return value
    raise ValueError(f"{name}='{value}' is not valid: use {ACCEPTED}, or the path of a file")
