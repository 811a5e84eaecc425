"""The cases of the Jupyter differential tests (test_jupyter_differential.py): each runs once on
a real IPython kernel (Debian's ipykernel, driven by jupyter_client) and once on evervm, through
E2B's `/execute` and through evervm's own API, and every field is compared.

A case is an id, its cells (run in order on one kernel and one machine, as a session), and the
fields it does not compare, each with the reason: the places where evervm knowingly differs.
E2B's own changes on top of the kernel are applied to the kernel's side by the test and named
there (E2B_CHANGES)."""

from typing import NamedTuple


class Case(NamedTuple):
    id: str
    cells: tuple[str, ...]
    # Fields left out of the comparison, each with why.
    known: tuple[tuple[str, str], ...] = ()


def case(id: str, *cells: str, known: tuple[tuple[str, str], ...] = ()) -> Case:
    return Case(id, cells, known)


CASES: list[Case] = [
    # --- values --------------------------------------------------------------------------------
    case("int", "1 + 1"),
    case("str", "'supertest'"),
    case("str-with-quote", '"it\'s"'),
    case("str-escaped-newline", "'a\\nb'"),
    case("none", "None"),
    case("assignment", "x = 1"),
    case("semicolon-hides", "1 + 1;"),
    case("list", "[1, 2, 3]"),
    case("dict", "{'a': 1, 'b': [1, 2]}"),
    case("tuple", "(1, 'two')"),
    case("set", "{3}"),
    case("float", "3.25"),
    case("bool", "True"),
    case("bytes", "b'bytes'"),
    case("long-list", "list(range(300))"),
    case("nested", "{'k': {'n': [1, {'d': None}]}}"),
    case("print-then-value", "print(1)\n2"),
    case("state", "y = 20", "y + 1"),
    case("underscore", "40 + 2", "_"),
    case("custom-repr", "class P:\n    def __repr__(self):\n        return 'P!'\nP()"),
    case(
        "repr-html",
        "class H:\n    def __repr__(self):\n        return 'H'\n"
        "    def _repr_html_(self):\n        return '<b>h</b>'\nH()",
    ),
    case("top-level-await", "import asyncio\nawait asyncio.sleep(0)\n7"),
    case("multiline-expression", "(1 +\n 2)"),
    # --- output --------------------------------------------------------------------------------
    case("print", "print('hi')"),
    case("print-no-newline", "print('x', end='')"),
    case("print-two", "print('a'); print('b', end='!')"),
    case("stderr", "import sys\nsys.stderr.write('err\\n')"),
    case("both-streams", "import sys\nprint('out')\nprint('err', file=sys.stderr)"),
    case("unicode", "print('héllo 🌍')"),
    case("tabs", "print('\\tx\\ty')"),
    case("loop", "for i in range(3):\n    print(i)"),
    case("empty-line", "print()"),
    case("write-partial", "import sys\nsys.stdout.write('partial')"),
    case("many-lines", "for i in range(200):\n    print('line', i)"),
    # --- errors --------------------------------------------------------------------------------
    case("zero-division", "1/0"),
    case("name-error", "undefined_name"),
    case("value-error", "raise ValueError('bad')"),
    case("two-line-message", "raise ValueError('first\\nsecond')"),
    case("json-decode", "import json\njson.loads('{')"),
    case(
        "class-in-function",
        "def f():\n    class FinalAnswerException(Exception):\n        pass\n"
        "    raise FinalAnswerException('done')\nf()",
    ),
    case("key-error-note", "e = KeyError('k')\ne.add_note('a note')\nraise e"),
    case("assert", "assert False, 'msg'"),
    case("syntax-error", "x = ("),
    case("indentation-error", "if True:\nprint(1)"),
    case("empty-exception", "raise Exception()"),
    case("exception-group", "raise ExceptionGroup('two', [ValueError(1), TypeError(2)])"),
    case("chained", "try:\n    1/0\nexcept Exception as e:\n    raise LookupError('outer') from e"),
    case(
        "str-raises",
        "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Odd()",
        known=(
            (
                "error",
                "the kernel fails formatting it and reports its own RuntimeError; evervm "
                "reports the exception raised, Odd, with `<exception str() failed>`",
            ),
        ),
    ),
    case("import-error", "import no_such_module_here"),
    case("index-error", "[][1]"),
    case("int-parse", "int('x')"),
    case("file-not-found", "open('/no/such/file')"),
    case("error-after-output", "print('before')\n1/0"),
    case("error-in-function", "def g():\n    return {}['missing']\ng()"),
    case("keyboard-interrupt-raised", "raise KeyboardInterrupt"),
    # --- IPython -------------------------------------------------------------------------------
    case("indented-cell", "\n    a = 1\n    a + 1"),
    case("indented-with-comment", "    # a comment\n    b = 2\n    b * 3"),
    case("shell-escape", "!echo from-the-shell"),
    case("cd-magic", "%cd /tmp", "import os\nos.getcwd()"),
    case("capture-magic", "%%capture\nprint('hidden')"),
    case("env-magic", "%env EVERVM_DIFF=on", "import os\nos.environ['EVERVM_DIFF']"),
    case("sh-cell-magic", "%%sh\necho hi"),
    case("html-cell-magic", "%%html\n<b>x</b>"),
    case("latex-cell-magic", "%%latex\n$x^2$"),
    case(
        "writefile",
        "import os\nif os.path.exists('evervm-diff.txt'):\n    os.remove('evervm-diff.txt')",
        "%%writefile evervm-diff.txt\nhello\n",
        "open('evervm-diff.txt').read()",
    ),
    case("unknown-magic", "%no_such_magic"),
    case("out-history", "6 * 7", "Out[len(Out)] if False else 1"),
    case("in-history", "z = 5", "_i"),
    # --- display -------------------------------------------------------------------------------
    case("display-markdown", "from IPython.display import display, Markdown\ndisplay(Markdown('**b**'))"),
    case("display-html", "from IPython.display import display, HTML\ndisplay(HTML('<i>i</i>'))"),
    case("display-json", "from IPython.display import display, JSON\ndisplay(JSON({'a': 1}))"),
    case("display-raw-latex", "display({'text/latex': '$y$'}, raw=True)"),
    case("display-two", "display(1, 'two')"),
    case("display-then-value", "display('shown')\n'value'"),
    case("display-dict", "display({'a': [1, 2]})"),
    # --- libraries -----------------------------------------------------------------------------
    case("dataframe", "import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})"),
    case("series", "import pandas as pd\npd.Series([1.5, 2.5], name='s')"),
    case(
        "dataframe-timestamps",
        "import pandas as pd\npd.DataFrame({'t': pd.to_datetime(['2024-01-01', '2024-01-02'])})",
    ),
    case("numpy-array", "import numpy as np\nnp.arange(6).reshape(2, 3)"),
    case("numpy-scalar", "import numpy as np\nnp.float64(1.5)"),
    # Charts: E2B's `e2b/chart` (e2b_charts) beside the figure's PNG, as matplotlib's inline
    # backend shows it at the cell's end or at plt.show().
    case(
        "chart-line",
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 1], label='a')\n"
        "plt.title('Line')\nplt.xlabel('x')\nplt.ylabel('y')\nplt.show()",
    ),
    case(
        "chart-bar-at-cell-end",
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
        "ax.bar(['a', 'b', 'c'], [3, 1, 2])\nax.set_title('Bars')",
    ),
    case(
        "chart-pie",
        "import matplotlib.pyplot as plt\nplt.pie([1, 2, 3], labels=['x', 'y', 'z'])\nplt.show()",
    ),
    case("figure-no-chart", "import matplotlib.pyplot as plt\nplt.figure()\nplt.show()"),
    case(
        "pil-save-shows",
        "from PIL import Image\nImage.new('RGB', (4, 4), 'red').save('/tmp/red.png')",
    ),
    case("pil-last-expression", "from PIL import Image\nImage.new('RGB', (2, 2))"),
]
