"""Errors of the side-effect calls (docs/pages/http-api.md, Side effects: once per key, and Error
codes)."""

from coordinator.core.errors import CoordinatorError


class EffectClaimed(CoordinatorError):
    code = "EFFECT_CLAIMED"
    status = 409
    retriable = True
    title = "Another owner holds the side effect's lease"


class FencedClaim(CoordinatorError):
    code = "FENCED_CLAIM"
    status = 409
    title = "The claim was lost"


class EffectNotFound(CoordinatorError):
    code = "EFFECT_NOT_FOUND"
    status = 404
    title = "Side effect not found"
