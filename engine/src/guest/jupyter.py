# evervm guest agent, Jupyter cells. The engine joins this file and agent.py into the one source
# the agent runs (this part first: it only defines; it runs when agent.py calls it).
#
# An instruction in the Jupyter dialect runs as a cell of an IPython kernel does, by IPython's
# own InteractiveShell over the machine's globals: magics (`%cd`, `%timeit`, `%%bash`), shell
# escapes (`!ls`), a cell's common indentation removed, `_`, `Out`, `In`, `display` and the
# display formatters. Only where a kernel would send messages does the agent step in: the
# displayhook's bundle becomes the instruction's value, `display()` a rich result sent at once,
# and a traceback the instruction's error (IPython's text, without colours). The E2B dialect
# adds what E2B's code interpreter registers on top of the kernel: a DataFrame's columns as
# `e2b/data`, a list or dict as JSON, and a matplotlib figure's `e2b/chart` when the image has
# E2B's `e2b_charts`.

import os as _jupyter_os
import sys as _jupyter_sys

# The MIME types E2B's code interpreter adds, carried as JSON.
E2B_DATA = "e2b/data"
E2B_CHART = "e2b/chart"


class JupyterCells:
    """IPython's shell over a machine's namespace (one per interpreter, made on first use)."""

    def __init__(self, namespace):
        try:
            from IPython.core.compilerop import CachingCompiler
            from IPython.core.displayhook import DisplayHook
            from IPython.core.displaypub import DisplayPublisher
            from IPython.core.interactiveshell import InteractiveShell
            from traitlets.config import Config
        except ImportError as exc:
            raise ModuleNotFoundError(
                "Jupyter cells need IPython, which this machine's image lacks (%s): use the "
                "`data` image (the default), or a custom image with python3-ipython" % exc
            ) from None
        cells = self

        class Hook(DisplayHook):
            """The value of the cell's last expression: kept, not printed."""

            def write_output_prompt(self):
                pass

            def write_format_data(self, format_dict, md_dict=None):
                cells.value = format_dict

            def finish_displayhook(self):
                pass

        class Publisher(DisplayPublisher):
            """`display()`: a rich result now, in order with the output."""

            def publish(self, data, metadata=None, source=None, *, transient=None, update=False,
                        **_ignored):
                if isinstance(data, dict):
                    _send_display("display", _checked_bundle(data))

            def clear_output(self, wait=False):
                pass

        class Compiler(CachingCompiler):
            """Names a cell's code as ipykernel does (a file named by a hash of the code), which
            shows in a SyntaxError's message."""

            def get_code_name(self, raw_code, transformed_code, number):
                return "/tmp/ipykernel_%d/%d.py" % (
                    _jupyter_os.getpid(), _murmur2(raw_code.encode("utf-8"), IPYKERNEL_HASH_SEED)
                )

        class Shell(InteractiveShell):
            displayhook_class = Hook
            display_pub_class = Publisher

            def _showtraceback(self, etype, evalue, stb):
                # A kernel sends the parts; IPython prints them a line each, E2B's server
                # joins them as they are.
                cells.traceback = ("" if cells.e2b_cell else "\n").join(stb)

            def init_virtualenv(self):
                pass

        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        config.InteractiveShell.colors = "NoColor"
        config.InteractiveShell.xmode = "Context"
        # As E2B's kernel: long lists and dicts are not cut short with `...`.
        config.PlainTextFormatter.max_seq_length = 0
        self.shell = Shell.instance(config=config, user_ns=namespace, compiler_class=Compiler)
        from IPython.core.error import UsageError

        self.usage_error = UsageError
        self.value = None
        self.traceback = None
        self.e2b = False
        self.e2b_cell = False
        self.figure_formats = False

    def add_e2b_formatters(self):
        """What E2B's code interpreter registers on top of the kernel (once)."""
        if self.e2b:
            return
        self.e2b = True
        from IPython.core.formatters import BaseFormatter, JSONFormatter
        from traitlets import ObjectName, Unicode

        class DataFormatter(BaseFormatter):
            format_type = Unicode(E2B_DATA)
            print_method = ObjectName("_repr_e2b_data_")

            def __call__(self, obj):
                pandas = _jupyter_sys.modules.get("pandas")
                if pandas is not None and isinstance(obj, pandas.DataFrame):
                    columns = obj.to_dict(orient="list")
                    return {
                        str(name): [_e2b_json_value(v) for v in values]
                        for name, values in columns.items()
                    }
                return super().__call__(obj)

        class ChartFormatter(BaseFormatter):
            format_type = Unicode(E2B_CHART)
            print_method = ObjectName("_repr_e2b_chart_")

            def __call__(self, obj):
                figure = _jupyter_sys.modules.get("matplotlib.figure")
                if figure is not None and isinstance(obj, figure.Figure):
                    try:
                        from e2b_charts import chart_figure_to_dict
                    except ImportError:
                        return None
                    try:
                        return chart_figure_to_dict(obj)
                    except Exception:
                        return {}
                return super().__call__(obj)

        class ListDictJSON(JSONFormatter):
            def __call__(self, obj):
                if isinstance(obj, (list, dict)):
                    try:
                        return json.loads(json.dumps(obj, default=_e2b_json_value))
                    except (TypeError, ValueError):
                        pass
                return super().__call__(obj)

        _show_saved_images()
        formatter = self.shell.display_formatter
        formatter.formatters[E2B_DATA] = DataFormatter(parent=formatter)
        formatter.formatters[E2B_CHART] = ChartFormatter(parent=formatter)
        formatter.formatters["application/json"] = ListDictJSON(parent=formatter)

    def figure_bundle(self, figure):
        """A matplotlib figure as a kernel's inline backend shows it: through the display
        formatters (PNG, and E2B's chart with E2B's formatters)."""
        if not self.figure_formats:
            from IPython.core.pylabtools import select_figure_formats

            select_figure_formats(self.shell, {"png"})
            self.figure_formats = True
        data, _metadata = self.shell.display_formatter.format(figure)
        return _checked_bundle(data)

    def run(self, code, e2b=False):
        """Runs a cell (as E2B's code interpreter does, with `e2b`); its value's bundle (None
        when it shows none), or raises what the cell raised, its traceback then in
        `traceback`."""
        self.value = None
        self.traceback = None
        self.e2b_cell = e2b
        # The cell's number, as a kernel numbers it (In[n]): IPython counts the cells it ran.
        self.count = self.shell.execution_count
        result = self.shell.run_cell(code, store_history=True)
        failure = result.error_before_exec or result.error_in_exec
        # A kernel shows a misused magic on stderr only (IPython printed it), not as an error.
        if failure is not None and not isinstance(failure, self.usage_error):
            raise failure
        value, self.value = self.value, None
        return _checked_bundle(value) if isinstance(value, dict) else None


def _show_saved_images():
    """As E2B's code interpreter: a PIL image saved to a path (a `str`) is also displayed."""
    try:
        from PIL import Image
    except Exception:
        return
    real_save = Image.Image.save
    if getattr(real_save, "_evervm_shows", False):
        return

    def save(image, fp, *args, **kwargs):
        if isinstance(fp, str):
            try:
                from IPython.display import display

                display(image)
            except Exception:
                pass
        return real_save(image, fp, *args, **kwargs)

    save._evervm_shows = True
    save.__doc__ = real_save.__doc__
    Image.Image.save = save


# ipykernel's seed for the hash that names a cell's code.
IPYKERNEL_HASH_SEED = 0xC70F6907


def _murmur2(data, seed):
    """MurmurHash2, 32-bit (Austin Appleby's), of bytes."""
    mask = 0xFFFFFFFF
    multiplier = 0x5BD1E995
    h = (seed ^ len(data)) & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * multiplier) & mask
        k ^= k >> 24
        k = (k * multiplier) & mask
        h = ((h * multiplier) & mask) ^ k
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * multiplier) & mask
    h ^= h >> 13
    h = (h * multiplier) & mask
    h ^= h >> 15
    return h


def _e2b_json_value(value):
    """A value of a DataFrame column or a list as JSON: timestamps as ISO 8601, numpy scalars
    as numbers, NaN as null, anything else as its text."""
    if hasattr(value, "isoformat"):
        try:
            return value.isoformat()
        except Exception:
            pass
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except Exception:
            pass
    if isinstance(value, float) and value != value:
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
