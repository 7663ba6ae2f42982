"""Checks for ``streamtap_*`` option values, run from the addons' ``configure()``.

A bad value stops mitmproxy at start with an ``OptionsError`` that names the option, as
mitmproxy's own addons do; otherwise it would be found per flow, mid-traffic (a typo in
``streamtap_fsync`` used to leave every flow unrecorded). mitmproxy does not enforce an
option's ``choices`` for a value given with ``--set`` before the script that declares it
has loaded, so choices are checked here too.
"""

from __future__ import annotations

import difflib
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from mitmproxy.exceptions import OptionsError
from mitmproxy.utils import typecheck

log = logging.getLogger("streamtap")

_PACKAGE = Path(__file__).resolve().parent.parent


def _raised_by_streamtap(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


def _one_line(record: logging.LogRecord) -> bool:
    """mitmproxy logs an exception from a script's first ``configure()`` with its traceback; for a
    bad ``streamtap_*`` value (an OptionsError raised here) the message alone says it all."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, OptionsError) and _raised_by_streamtap(error):
        record.msg, record.args = f"{record.getMessage()}: {error}", ()
        record.exc_info = record.exc_text = None
    return True


def plain_option_errors() -> None:
    """Show a bad option value at start as one line, not a traceback (mitmproxy still exits)."""
    script_log = logging.getLogger("mitmproxy.addons.script")
    if _one_line not in script_log.filters:
        script_log.addFilter(_one_line)


def choice(option: str, value: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise OptionsError(f"{option}: {value!r} is not one of {', '.join(choices)}")


def size(option: str, value: int, smallest: int, largest: int, unit: str = "bytes") -> None:
    if type(value) is not int:  # YAML's true, set at runtime (options.load): mitmproxy's check takes a bool as an int
        raise OptionsError(f"{option}: {value!r} is not an integer")
    if not smallest <= value <= largest:
        raise OptionsError(f"{option}: {value} is outside {smallest}..{largest} {unit}")


def writable_dir(option: str, value: str) -> None:
    """The directory exists and is writable, or could be created (its nearest existing
    ancestor is a writable directory). Only a trial folder is made there, and removed: as root,
    ``os.access`` says yes to every folder, /proc's included."""
    if not value.strip():
        raise OptionsError(f"{option}: empty; name a directory for the recordings")
    if "\0" in value:  # no path holds one; exists() says False of it, so the walk up would find a parent
        raise OptionsError(f"{option}: {value!r} holds a NUL character, which no path can")
    expanded = os.path.expanduser(value)  # as the addon expands it
    if expanded.startswith("~"):  # os.path leaves an unknown ~user as it is: a folder of that name here is not what was meant
        raise OptionsError(f"{option}: {value!r}: no home folder for {expanded.split('/', 1)[0]!r}")
    path = Path(expanded).absolute()
    probe = path
    try:
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
    except OSError as exc:  # a folder name longer than the file system takes, a path too long
        raise OptionsError(f"{option}: {value!r} cannot be a directory ({exc.strerror or exc})") from None
    if not probe.is_dir():
        raise OptionsError(f"{option}: {value!r} cannot be a directory: {probe} is not one")
    what = "is not writable" if probe == path else f"cannot be created: {probe} is not writable"
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OptionsError(f"{option}: {value!r} {what}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".streamtap-check-", dir=probe))
    except OSError as exc:
        raise OptionsError(f"{option}: {value!r} {what} ({exc.strerror or exc})") from None


def names(option: str, values: Iterable[str]) -> None:
    """Header or query parameter names; one per value (``--set {option}=a --set {option}=b``)."""
    from streamtap.recording.redact import name_problem

    for name in values:
        if name_problem(name):
            raise OptionsError(f"{option}: {name!r} is not a header or query parameter name (give each name in its own --set)")


EMPTY_SENTINEL = "empty; an empty sentinel (an unset shell variable?) would turn the check off without a word (leave the option out)"


def sentinel(option: str, value: str | None) -> None:
    from streamtap.providers import sentinel_problem

    problem = EMPTY_SENTINEL if value == "" else sentinel_problem(value)
    if problem:
        raise OptionsError(f"{option}: {problem}")


def dotted_paths(option: str, values: Iterable[str]) -> None:
    from streamtap.replay.match import field_path_problem

    for path in values:
        problem = field_path_problem(path)
        if problem:
            raise OptionsError(f"{option}: {problem}")


def given_before_load(loader) -> None:
    """Check the ``streamtap_*`` values given before the script loaded: with ``--set`` (strings
    to parse) or in mitmproxy's options file (``config.yaml``, or one ``options.load`` read;
    typed by YAML).

    mitmproxy takes them (bool, int) only once the addon's ``load()`` has returned, and a
    value of the wrong type then fails inside its script loader: from ``--set``, it drops every
    addon of the script without a word; from ``config.yaml``, it prints a traceback. A bad one is
    logged here as an error instead (mitmdump stops at start on an error) and dropped, so
    mitmproxy can load the rest."""
    options = loader.master.options
    try:
        deferred, declared, parse = options.deferred, options._options, options._parse_setval
    except AttributeError:  # another mitmproxy: its own handling stands
        return
    for name in [n for n in deferred if n.startswith("streamtap_") and n in declared]:
        value = deferred[name]
        try:
            given = value.val if hasattr(value, "val") else value
            if name == "streamtap_sentinel" and given in ("", [""]):  # mitmproxy would take it for the option left out
                raise OptionsError(f"{name}: {EMPTY_SENTINEL}")
            if hasattr(value, "val"):  # --set: the strings as given
                parse(declared[name], value.val)
            elif not _of_type(value, declared[name].typespec):
                raise OptionsError(f"{name}: {value!r} in mitmproxy's options file is not {_expected(declared[name].typespec)}")
        except OptionsError as exc:
            log.error(f"streamtap: {exc}")
            del deferred[name]
        except Exception:
            pass


def names_not_known(options) -> bool:
    """Once every addon has loaded: a ``streamtap_*`` name given that no addon declares (a typo,
    or the pytest marker's ``streamtap_faults``) is logged as an error, which stops mitmdump at
    start. mitmproxy keeps such a name aside without a word, so the option silently did nothing."""
    try:
        deferred, declared = options.deferred, options._options
    except AttributeError:  # another mitmproxy: its own handling stands
        return False
    known = sorted(name for name in declared if name.startswith("streamtap_"))
    unknown = sorted(n for n in deferred if n.startswith("streamtap_") and n not in declared)
    for name in unknown:
        near = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {near[0]}?" if near else f"streamtap's options are {', '.join(known)}"
        log.error(f"streamtap: {name}: no such option; {hint}")
    return bool(unknown)


def _expected(typespec) -> str:
    if typespec is bool:
        return "true or false"
    if typespec is int:
        return "an integer"
    return "a list of strings" if typespec == Sequence[str] else "a string"


def _of_type(value, typespec) -> bool:
    if isinstance(value, bool) and typespec is int:  # YAML's true is no size or count (mitmproxy's check takes it: bool is an int)
        return False
    try:
        typecheck.check_option_type("", value, typespec)
    except TypeError:
        return False
    return True
