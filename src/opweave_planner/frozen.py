"""The one base of the planner's input and plan models: immutable (hashable, safe to share across
threads and caches) and strict (an unknown key is a typo, refused rather than ignored)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
