"""The history ft.fit returns: a dict of per-epoch lists that also plots itself and shows as a table in Jupyter."""
from ._display import Column, Table


def _cell(v):
    if v is None:
        return ""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class History(dict):
    """What ft.fit returns: a dict of per-epoch lists ("epoch", "train_loss", "train_accuracy", "val_loss",
    "val_accuracy", "lr", "seconds", "images_per_second", "skipped_steps" (steps skipped for a non-finite loss or
    gradient: train_loss and train_accuracy are over the others, NaN and None when every step was skipped),
    "loss_scale" (a GradScaler's scale at the epoch's end); None where an epoch had no validation or no scaler).
    It is a dict in every way (indexing, keys(), equality with a dict, json.dumps, pickle), with plot() added;
    Jupyter shows it as a table with a row per epoch. History(json.load(f)) plots a history saved as JSON."""

    def plot(self):
        """Plots the loss curves (training, and validation when there was a validation set) and, beside them, the
        accuracies in percent (training, and validation when there was one), against the epoch, with matplotlib's
        pyplot (imported here, so fasttrain itself does not need matplotlib). Returns the list of Axes, one per
        panel (axes[0].figure is the figure): in a notebook the figure shows once, and in a script plt.show() or
        axes[0].figure.savefig(path) shows or saves it."""
        try:
            import matplotlib.pyplot as plt
            from matplotlib.ticker import MaxNLocator
        except ImportError as e:
            raise ImportError(f"History.plot() draws with matplotlib, which is not installed ({e}): "
                              "pip install matplotlib") from e

        epochs = self.get("epoch") or list(range(1, len(self.get("train_loss", ())) + 1))

        def points(key, scale=1.0):
            pairs = [(e, v * scale) for e, v in zip(epochs, self.get(key, ())) if v is not None]
            return [e for e, _ in pairs], [v for _, v in pairs]

        accuracies = [(points(key, 100.0), label) for key, label in (("train_accuracy", "training"),
                                                                      ("val_accuracy", "validation"))]
        accuracies = [(a, label) for a, label in accuracies if a[0]]
        fig, axes = plt.subplots(1, 2 if accuracies else 1, figsize=(9 if accuracies else 4.5, 3.2), squeeze=False)
        axes = list(axes[0])
        loss = axes[0]
        loss.plot(*points("train_loss"), "o-", label="training")
        val_loss = points("val_loss")
        if val_loss[0]:
            loss.plot(*val_loss, "o-", label="validation")
        loss.set_xlabel("epoch")
        loss.set_ylabel("loss")
        loss.legend()
        for points_, label in accuracies:
            axes[1].plot(*points_, "o-", label=label)
        if accuracies:
            axes[1].set_xlabel("epoch")
            axes[1].set_ylabel("accuracy (%)")
            axes[1].legend()
        for ax in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        return axes

    def _repr_html_(self):
        # Jupyter's form: a row per epoch, a column per metric
        keys = list(self)
        rows = zip(*(self[k] for k in keys)) if keys else ()
        return Table([Column(k, align=">") for k in keys], [[_cell(v) for v in row] for row in rows]).html()
