"""Highlighting for LLM-TL: a small pygments lexer whose words come from the language's own definitions (the
parser's grammar and statement forms, the operator table, the AST's names, the Variant's fields), so a word the
language gains is highlighted without a second list to keep.

    from flashgen.tl_spec.highlight import tl_html, lexer
    html = tl_html(text)            # a highlighted, scrollable block (plain when pygments is not installed)

pygments is optional (the notebook extra); `lexer()` raises flashgen.display.MissingPackage without it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from flashgen import display


@lru_cache(maxsize=1)
def words() -> dict[str, tuple[str, ...]]:
    """The language's words by kind: statement keywords, the grammar's other words, operator words, functions,
    memory levels, dtypes, variant words, builtin names."""
    from flashgen import operators
    from flashgen.tl_spec import ast, parser
    from flashgen.variant import DType, Norm, Variant

    grammar_words = set(re.findall(r'"([A-Za-z_]+)"', parser.GRAMMAR))
    statements = tuple(parser.KEYWORDS)
    operator_words = tuple(sorted({"and", "or", "not"} & grammar_words))
    functions = tuple(sorted(f.name for f in operators.FUNCTIONS.values()))
    reserved = tuple(sorted(grammar_words - set(statements) - set(operator_words)))  # `max` too: `with max m_i`
    return {
        "statements": statements,
        "reserved": reserved,
        "operators": operator_words,
        "functions": functions,
        "levels": tuple(level.value for level in ast.Level),
        "dtypes": tuple(d.value for d in DType),
        "variant": tuple(n.value for n in Norm) + tuple(Variant.model_fields),
        "names": tuple(ast.SIZE_NAMES) + tuple(ast.CONSTANTS) + tuple(ast.RUNTIME_SCALARS)
        + tuple(ast.VARIANT_SCALARS) + tuple(ast.INDEX_NAMES),
    }


def _alternation(items) -> str:
    return r"\b(" + "|".join(sorted((re.escape(w) for w in set(items)), key=len, reverse=True)) + r")\b"


@lru_cache(maxsize=1)
def lexer_class():
    """The pygments lexer class for LLM-TL (built on first use: pygments is optional)."""
    display.need("pygments", "highlighting LLM-TL")
    from pygments.lexer import RegexLexer
    from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, Text

    w = words()

    class LLMTLLexer(RegexLexer):
        name = "LLM-TL"
        aliases = ["llm-tl", "tl"]
        filenames = ["*.tl"]
        tokens = {
            "root": [
                (r"#.*?$", Comment.Single),
                (r"\s+", Text),
                (_alternation(w["statements"]), Keyword),
                (_alternation(w["operators"]), Operator.Word),
                (_alternation(w["functions"]) + r"(?=\s*\()", Name.Builtin),
                (_alternation(w["reserved"]), Keyword.Reserved),
                (_alternation(w["levels"]), Keyword.Type),
                (_alternation(w["dtypes"]), Keyword.Type),
                (r"\bsm_\d+a?\b", Name.Label),
                (_alternation(w["variant"]), Name.Attribute),
                (_alternation(w["names"]), Name.Constant),
                (r"\^T\b", Operator),
                (r"([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?", Number),
                (r"[A-Za-z_][A-Za-z0-9_]*", Name),
                (r"//|<=|>=|==|!=|[-+*/%<>=]", Operator),
                (r"[\[\](),:]", Punctuation),
                (r".", Text),
            ]
        }

    return LLMTLLexer


def lexer():
    return lexer_class()()


def tl_html(text: str) -> str:
    """`text` as a highlighted code block (plain, escaped, without pygments)."""
    try:
        tl_lexer = lexer()
    except display.MissingPackage:
        tl_lexer = None
    return display.code(text, tl_lexer, language="llm-tl")
