"""Training: the trainer (:mod:`.trainer`), the optimizer and its schedules (:mod:`.optim`)."""

__all__: list[str] = []
