"""The command line of every script, generated from its config dataclass (a typed nanoGPT configurator.py).

    cfg = config.parse(SFTConfig, ["--lr=3e-4", "--mode", "seen"])     # --key=value or --key value

A field's annotation is its type: int, float, str, bool (true/false), `X | None` ("None"), tuple[float, float]
("0.9,0.95"), Literal[...] (the allowed values); the comment after it is its --help. `base` (a checkpoint's config, for
--resume) replaces the defaults; `fill` applies a preset to the None fields; `at_least` is every script's range check.
"""
import argparse
import dataclasses
import inspect
import re
import types
import typing

def true_or_false(text: str) -> bool:
    if text.lower() not in ("true", "1", "yes", "false", "0", "no"):
        raise ValueError(text)
    return text.lower() in ("true", "1", "yes")

def converter(hint):
    """(the function that parses a value of this annotation, the allowed values or None)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):                        # X | None
        inner, choices = converter(next(a for a in args if a is not type(None)))
        optional = lambda text: None if text == "None" else inner(text)  # noqa: E731
        optional.__name__ = f"{inner.__name__} or None"
        return optional, choices and [*choices, None]
    if origin is typing.Literal:
        return str, list(args)
    if origin is tuple:                                                  # "0.9,0.95" -> (0.9, 0.95)
        values = lambda text: tuple(t(p) for t, p in zip(args, text.strip("()").split(","), strict=True))  # noqa: E731
        values.__name__ = f"{len(args)}-tuple"
        return values, None
    return (true_or_false if hint is bool else hint), None

def parse(cls, argv: list[str], base: dict | None = None):
    """The `cls` the command line describes. argparse exits with the usage and the reason on a bad argument."""
    helps = dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.*)$", inspect.getsource(cls), re.M))
    hints, base = typing.get_type_hints(cls), base or {}
    p = argparse.ArgumentParser(description=cls.__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(cls):
        convert, choices = converter(hints[f.name])
        default = base.get(f.name, f.default)
        p.add_argument(f"--{f.name}", type=convert, choices=choices, default=default,
                       help=f"{helps.get(f.name, '')} (default: {default!r})")
    values = vars(p.parse_args(argv))
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})   # JSON turns tuples to lists

def fill(cfg, preset: dict):
    """`cfg` with the preset's value in every field that is None (the tiny or the real-model defaults)."""
    return dataclasses.replace(cfg, **{k: v for k, v in preset.items() if getattr(cfg, k) is None})

def at_least(cfg, least: float, *names: str, above: bool = False):
    """ValueError naming each set field below `least` (`above`: not above it, or infinite); NaN fails both."""
    bad = [f"--{n}={v}" for n in names if (v := getattr(cfg, n)) is not None and not
           (least < v < float("inf") if above else v >= least)]
    if bad:
        raise ValueError(f"{', '.join(bad)}: must be {f'above {least} (and finite)' if above else f'at least {least}'}")
