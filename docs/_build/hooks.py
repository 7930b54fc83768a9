"""MkDocs hooks of the documentation site.

Maths: ``pymdownx.arithmatex`` (generic mode) leaves each formula as ``\\(...\\)`` or ``\\[...\\]``
inside a ``<span|div class="arithmatex">``; :func:`on_page_content` converts it to MathML with
latex2mathml, so that maths needs no JavaScript and no network. A formula that does not convert
fails the build naming the page and the formula (strict mode must not ship raw TeX), and so does
a command latex2mathml does not know.
"""

from __future__ import annotations

import html
import re

import latex2mathml.converter

_ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.DOTALL)


class MathError(ValueError):
    pass


_UNKNOWN_COMMAND = re.compile(r">(\\[A-Za-z]+)<")

# Characters latex2mathml emits that common fonts lack (Chromium showed a missing-glyph box):
# \setminus becomes U+29F5 REVERSE SOLIDUS OPERATOR; U+2216 SET MINUS is in DejaVu and Liberation.
_GLYPHS = {"<mi>&#x029F5;</mi>": "<mo>&#x02216;</mo>"}


def tex_to_mathml(tex: str, display: bool) -> str:
    """MathML for ``tex``. latex2mathml passes a command it does not know through as an
    identifier (``<mi>\\foo</mi>``), which would show TeX source on the page: that is an error."""
    mathml = latex2mathml.converter.convert(tex, display="block" if display else "inline")
    unknown = _UNKNOWN_COMMAND.search(mathml)
    if unknown:
        raise ValueError(f"unknown command {unknown.group(1)}")
    for old, new in _GLYPHS.items():
        mathml = mathml.replace(old, new)
    return mathml


def _convert(match: re.Match, page: str) -> str:
    body = html.unescape(match.group(2)).strip()
    if body.startswith("\\(") and body.endswith("\\)"):
        tex, display = body[2:-2], False
    elif body.startswith("\\[") and body.endswith("\\]"):
        tex, display = body[2:-2], True
    else:
        raise MathError(f"{page}: unexpected arithmatex output {body[:80]!r}")
    try:
        mathml = tex_to_mathml(tex.strip(), display)
    except Exception as exc:  # latex2mathml raises several exception types
        raise MathError(f"{page}: formula {tex!r} does not convert to MathML: {exc}") from exc
    tag = "div" if display else "span"
    return f'<{tag} class="arithmatex">{mathml}</{tag}>'


def on_page_content(html_text: str, page, config, files) -> str:
    return _ARITHMATEX.sub(lambda m: _convert(m, page.file.src_uri), html_text)
