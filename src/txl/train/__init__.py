"""Training: the trainer (:mod:`.trainer`), what a run may start with (:mod:`.checks`), the optimizer and its
schedules (:mod:`.optim`)."""

__all__: list[str] = []
