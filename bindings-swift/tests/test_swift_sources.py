"""The Swift that no compiler here builds, parsed instead: every Swift file of the package and of
examples/swift must be free of syntax errors under tree-sitter's Swift grammar. This catches what
a parser can (a missing brace, a misspelt keyword, a bad pattern); types and names need a Mac."""

from pathlib import Path

import pytest
import tree_sitter
import tree_sitter_swift

REPO = Path(__file__).resolve().parents[2]
SWIFT_FILES = sorted(
    [*(REPO / "bindings-swift").glob("**/*.swift"), *(REPO / "examples" / "swift").glob("**/*.swift")]
)
# An underscored attribute the grammar does not know, on every internal declaration uniffi
# generates; blanked (same length, so positions hold) before parsing.
UNKNOWN_TO_GRAMMAR = b"@_documentation(visibility: private)"


def syntax_errors(source: bytes) -> list[str]:
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_swift.language()))
    tree = parser.parse(source.replace(UNKNOWN_TO_GRAMMAR, b" " * len(UNKNOWN_TO_GRAMMAR)))
    errors, pending = [], [tree.root_node]
    while pending:
        node = pending.pop()
        if node.is_error or node.is_missing:
            what = "missing" if node.is_missing else "unexpected"
            line, column = node.start_point
            errors.append(f"{line + 1}:{column + 1}: {what} {node.text[:60]!r}")
        else:
            pending.extend(node.children)
    return errors


def test_every_swift_file_is_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in SWIFT_FILES}
    for expected in [
        "bindings-swift/Package.swift",
        "bindings-swift/Sources/Evervm/Evervm.swift",
        "bindings-swift/Sources/Evervm/Evervm+Concurrency.swift",
        "examples/swift/Package.swift",
        "examples/swift/Sources/Quickstart/main.swift",
    ]:
        assert expected in names


@pytest.mark.parametrize("path", SWIFT_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_swift_file_parses(path: Path) -> None:
    assert syntax_errors(path.read_bytes()) == []


def test_the_check_finds_errors() -> None:
    assert syntax_errors(b"let x = try await machine.exec(code: \"1\")\n") == []
    assert syntax_errors(b"func f() {\n    switch x {\n    case .a(let m: return m\n    }\n}\n")
    assert syntax_errors(b"extension Machine {\n    public func f() {\n")
