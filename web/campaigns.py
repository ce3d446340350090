"""``/api/v1/campaigns``: notification campaigns sent through provider groups."""

from __future__ import annotations

import string
from typing import Any

from flask import Blueprint, g
from pydantic import ConfigDict, Field, field_validator, model_validator

from tasks.notifications import campaigns, service, templates
from tasks.platform import quotas
from web.api import operation
from web.auth import OPERATOR, Principal
from web.schemas import Open, Strict, configured_bound

bp = Blueprint("campaigns", __name__, url_prefix="/api/v1/campaigns")
MAX_LISTED_RECIPIENTS = 10_000
MAX_SYNTHETIC_RECIPIENTS = 1_000_000
# Only ``{name}`` placeholders: str.format's attribute/index access ("{to.__class__}"),
# positional fields and format specs ("{to:>2000000000}" makes a 2 GB string in the
# worker) are not part of the contract and are refused here (and never rendered).
TEMPLATE = templates.PLACEHOLDERS


class Recipient(Strict):
    to: str = Field(min_length=1, max_length=200)
    vars: dict[str, Any] = Field(default_factory=dict)


class CreateCampaign(Strict):
    # The document states the exactly-one rule that ``_one_source`` enforces.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["recipients"], "properties": {"recipients": {"type": "array"}}},
                {
                    "required": ["recipientCount"],
                    "properties": {"recipientCount": {"type": "integer"}},
                },
            ]
        }
    )

    name: str = Field(min_length=1, max_length=200)
    category: str = Field(min_length=1, max_length=100)
    template: str = Field(
        min_length=1,
        max_length=2000,
        pattern=TEMPLATE,
        description="{name} placeholders only; {{ }} for braces",
    )
    recipients: list[Recipient] | None = Field(
        default=None, min_length=1, max_length=MAX_LISTED_RECIPIENTS
    )
    recipientCount: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SYNTHETIC_RECIPIENTS,
        description="synthetic recipients, for load tests",
    )
    chunkSize: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="at least the tenant quota minChunkSize",
        json_schema_extra=configured_bound("minimum", lambda: quotas.current().min_chunk_size),
    )

    @field_validator("template")
    @classmethod
    def _placeholders_parse(cls, template: str) -> str:
        try:
            list(string.Formatter().parse(template))
        except ValueError as exc:
            raise ValueError(f"template placeholders: {exc}") from None
        return template

    @model_validator(mode="after")
    def _one_source(self) -> CreateCampaign:
        if (self.recipients is None) == (self.recipientCount is None):
            raise ValueError("give exactly one of recipients or recipientCount")
        return self


class CampaignAccepted(Open):
    campaignId: str
    statusUrl: str


class CampaignStatus(Open):
    campaignId: str
    state: str
    chunks: dict[str, int]
    generations: list[dict[str, Any]]
    stalled: bool


class Resumed(Open):
    campaignId: str
    requeuedChunks: int


def campaign_for(principal: Principal, campaign_id: str) -> campaigns.Campaign:
    """The campaign if ``principal`` may see it: its own, or (operators) its tenant's."""
    return campaigns.get_owned(campaign_id, principal.owner, tenant_wide=principal.operator)


def resume_for(principal: Principal, campaign_id: str) -> dict[str, Any]:
    """An operator's resume (the caller checked the role) of a campaign of its tenant."""
    return service.resume(principal.owner, campaign_id, principal.user_id)


def _status_url(campaign_id: str) -> str:
    return f"{bp.url_prefix}/{campaign_id}"


@operation(
    bp,
    "",
    "POST",
    summary="Start a notification campaign",
    body=CreateCampaign,
    responses={202: CampaignAccepted, 400: None},
    idempotent=True,
)
def create_campaign(body: CreateCampaign):
    spec = service.NewCampaign(
        name=body.name,
        category=body.category,
        template=body.template,
        recipients=[r.model_dump() for r in body.recipients] if body.recipients else None,
        recipient_count=body.recipientCount,
        chunk_size=body.chunkSize,
    )
    campaign = service.create(g.principal.owner, spec, quotas.current())
    return {"campaignId": campaign.id, "statusUrl": _status_url(campaign.id)}, 202


@operation(
    bp,
    "/<campaign_id>",
    "GET",
    summary="A campaign's chunks, generations and report",
    responses={200: CampaignStatus, 404: None},
)
def get_campaign(campaign_id: str):
    return campaigns.describe(campaign_for(g.principal, campaign_id))


@operation(
    bp,
    "/<campaign_id>/resume",
    "POST",
    role=OPERATOR,
    summary="Re-dispatch a campaign's unfinished chunks and sends",
    responses={202: Resumed, 400: None, 404: None},
)
def resume_campaign(campaign_id: str):
    return resume_for(g.principal, campaign_id), 202
