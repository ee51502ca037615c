"""Masking personal data: email addresses, US phone numbers and IPv4 addresses become placeholders.

    "mail jo@example.com or call (555) 123-4567"  ->  "mail |||EMAIL_ADDRESS||| or call |||PHONE_NUMBER|||"

The placeholders are the CS336 data assignment's. Each `mask_*` function returns the new text and how many it
masked; `PIIMasker` runs the kinds its config names, in the order emails, phone numbers, IP addresses, and counts
them in its stats ("emails masked", ...). Patterns are regular expressions, so they trade recall for precision:
a phone number spelled out or split across lines stays, and a bare ten-digit number is taken for a phone number.
Not here: names, street addresses and other PII that need a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gptlab.curate.document import Document, Transform
from gptlab.runtime import GptlabError

# local@domain.tld: the domain needs a dot and a top-level label of letters, so "a@b" and "user@localhost" stay.
EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b")

# NANP numbers: an optional +1, a 3-digit area code (bare or in parentheses), 3 digits, 4 digits, separated by
# nothing, one space, a dot or a hyphen (after the parentheses too, as in "(283)-182-3829" and "(283).182.3829"). Not glued to other digits or letters, so dates (2024-01-15), zip+4 codes
# (12345-6789), social security numbers (123-45-6789) and card numbers (4111 1111 1111 1111) do not match.
# Area codes never start with 0 or 1 (NANP), which spares ten-digit Unix times (1700000000) and many ids.
PHONE_NUMBER = re.compile(r"""
    (?<![\w+])                                    # not the tail of a longer number or word
    (?:\+?1[ .-]?)?                               # country code
    (?:\([2-9][0-9]{2}\)[ .-]?|[2-9][0-9]{2}[ .-]?)  # area code, "(283)-182-3829" too
    [0-9]{3}[ .-]?[0-9]{4}
    (?!\w)
""", re.VERBOSE)

# Four dotted octets, each 0-255 written without leading zeros. Not part of a longer dotted number (a version such
# as 1.2.3.4.5, or 10.0.0.1.2), so three-part versions (1.2.3) and 256.1.1.1 stay.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IP_ADDRESS = re.compile(rf"(?<!\w)(?<![0-9]\.){_OCTET}(?:\.{_OCTET}){{3}}(?!\w)(?!\.[0-9])")

EMAIL_PLACEHOLDER = "|||EMAIL_ADDRESS|||"
PHONE_PLACEHOLDER = "|||PHONE_NUMBER|||"
IP_PLACEHOLDER = "|||IP_ADDRESS|||"


def mask_emails(text: str, placeholder: str = EMAIL_PLACEHOLDER) -> tuple[str, int]:
    """Email addresses replaced: ("write to a.b@mail.example.org.", ...) -> ("write to |||EMAIL_ADDRESS|||.", 1)."""
    return EMAIL.subn(placeholder, text)


def mask_phone_numbers(text: str, placeholder: str = PHONE_PLACEHOLDER) -> tuple[str, int]:
    """US phone numbers replaced: (555) 123-4567, 555-123-4567, 555.123.4567, 555 123 4567, +1 555 123 4567,
    5551234567 -> the placeholder, one count each."""
    return PHONE_NUMBER.subn(placeholder, text)


def mask_ip_addresses(text: str, placeholder: str = IP_PLACEHOLDER) -> tuple[str, int]:
    """IPv4 addresses replaced: "from 192.168.0.1" -> "from |||IP_ADDRESS|||"; 999.1.1.1 and 1.2.3 stay."""
    return IP_ADDRESS.subn(placeholder, text)


@dataclass(frozen=True, kw_only=True)
class PIIConfig:
    """Which kinds of personal data to mask, and what each becomes."""

    emails: bool = True
    phone_numbers: bool = True
    ip_addresses: bool = True
    email_placeholder: str = EMAIL_PLACEHOLDER
    phone_placeholder: str = PHONE_PLACEHOLDER
    ip_placeholder: str = IP_PLACEHOLDER

    def __post_init__(self) -> None:
        for name in ("email_placeholder", "phone_placeholder", "ip_placeholder"):
            if not getattr(self, name):
                raise GptlabError(f"PIIConfig.{name} is empty: give the text to put in place of what is masked, "
                                  f"such as {PIIConfig.__dataclass_fields__[name].default!r}")


class PIIMasker(Transform):
    """Masks the kinds of personal data its config names, counting each kind in stats.changes.

    Emails go first: an address such as 5551234567@example.com would otherwise lose its digits to the phone pattern.
    """

    name = "pii"

    def __init__(self, config: PIIConfig | None = None) -> None:
        super().__init__()
        self.config = config or PIIConfig()

    def transform(self, document: Document) -> Document:
        config = self.config
        steps = [(config.emails, mask_emails, config.email_placeholder, "emails masked"),
                 (config.phone_numbers, mask_phone_numbers, config.phone_placeholder, "phone numbers masked"),
                 (config.ip_addresses, mask_ip_addresses, config.ip_placeholder, "IP addresses masked")]
        text = document.text
        for enabled, mask, placeholder, counter in steps:
            if enabled:
                text, count = mask(text, placeholder)
                if count:
                    self.stats.changes[counter] += count
        if text == document.text:
            return document
        self.stats.changes["documents masked"] += 1
        return Document(id=document.id, text=text, metadata=document.metadata)
