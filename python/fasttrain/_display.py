"""Text and HTML renderings of fasttrain's objects. A table is built once, as rows of cells already formatted as
strings; its text (fixed-width columns) and its HTML (a <table>, every cell escaped) are both drawn from those
rows. Jupyter shows an object's _repr_html_; everywhere else the object prints as text."""
import html


class Column:
    """A column of a Table: its header, and for the text form its width, alignment ("<" or ">") and the spaces
    before it."""

    def __init__(self, name, width=0, align="<", gap=""):
        self.name, self.width, self.align, self.gap = name, width, align, gap

    def pad(self, cell):
        return self.gap + (cell.rjust(self.width) if self.align == ">" else cell.ljust(self.width))


class Table:
    """Rows of string cells under columns. totals: {column name: (label, cell)}, the sums of the table, written as
    "label: cell" after the rows in text and as a last row under those columns in HTML. notes: lines after the
    table."""

    def __init__(self, columns, rows, totals=None, notes=()):
        self.columns, self.rows = list(columns), [list(r) for r in rows]
        self.totals, self.notes = dict(totals or {}), list(notes)

    def text(self):
        lines = ["".join(c.pad(c.name) for c in self.columns)]
        lines += ["".join(c.pad(cell) for c, cell in zip(self.columns, row)) for row in self.rows]
        if self.totals:
            lines.append("   ".join(f"{label}: {cell}" for label, cell in self.totals.values()))
        return "\n".join(lines + self.notes)

    def html(self, caption=None):
        def cells(tag, row):
            return "".join(f"<{tag}{_RIGHT if c.align == '>' else ''}>{html.escape(cell)}</{tag}>"
                           for c, cell in zip(self.columns, row))

        out = ['<table class="fasttrain">']
        if caption:
            out.append(f"<caption>{html.escape(caption)}</caption>")
        out.append(f"<thead><tr>{cells('th', [c.name for c in self.columns])}</tr></thead><tbody>")
        out += [f"<tr>{cells('td', row)}</tr>" for row in self.rows]
        out.append("</tbody>")
        if self.totals:
            row = [self.totals[c.name][1] if c.name in self.totals else "" for c in self.columns]
            row[0] = row[0] or "total"
            out.append(f"<tfoot><tr>{cells('th', row)}</tr></tfoot>")
        out.append("</table>")
        if self.notes:
            out.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in self.notes) + "</ul>")
        return "".join(out)


_RIGHT = ' style="text-align: right"'


class Summary(str):
    """The text of a summary() (it prints, compares and splits as that string); Jupyter shows the same table in
    HTML."""

    def _repr_html_(self):
        return self.table.html()

    def _repr_pretty_(self, printer, cycle):  # IPython's plain-text form: the table, not a quoted string
        printer.text(str(self))


def summary(table):
    """A Summary of a Table: its text, with the table kept for the HTML."""
    s = Summary(table.text())
    s.table = table
    return s
