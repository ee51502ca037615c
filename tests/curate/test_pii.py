"""PII masking: each format masked and counted, look-alikes left alone, and the stage's counts."""

import pytest

from gptlab.curate.document import Document
from gptlab.curate.pii import (
    EMAIL_PLACEHOLDER,
    IP_PLACEHOLDER,
    PHONE_PLACEHOLDER,
    PIIConfig,
    PIIMasker,
    mask_emails,
    mask_ip_addresses,
    mask_phone_numbers,
)
from gptlab.runtime import GptlabError


@pytest.mark.parametrize("email", ["jo@example.com", "first.last+tag@mail.example.co.uk", "a_b-c%d@sub-domain.org",
                                   "UPPER@EXAMPLE.COM", "5551234567@example.com"])
def test_mask_emails_replaces_each_address_format(email):
    assert mask_emails(f"write to {email}, thanks") == (f"write to {EMAIL_PLACEHOLDER}, thanks", 1)


def test_mask_emails_leaves_the_sentence_full_stop_outside():
    assert mask_emails("mail a@b.com.") == (f"mail {EMAIL_PLACEHOLDER}.", 1)


@pytest.mark.parametrize("text", ["a@b", "user@localhost", "@example.com", "me@ example.com", "price: 5@3.50"])
def test_mask_emails_leaves_addresses_without_a_dotted_domain(text):
    assert mask_emails(text) == (text, 0)


@pytest.mark.parametrize("phone", ["(283)-182-3829", "(283).182.3829", "(283) 182.3829", "(555) 123-4567", "(555)123-4567",
                                   "555-123-4567", "555.123.4567", "555 123 4567",
                                   "+1 555 123 4567", "+1-555-123-4567", "+15551234567", "1 (555) 123-4567",
                                   "5551234567"])
def test_mask_phone_numbers_replaces_each_us_format(phone):
    assert mask_phone_numbers(f"call {phone} today") == (f"call {PHONE_PLACEHOLDER} today", 1)


@pytest.mark.parametrize("text", ["on 2024-01-15", "zip 12345-6789", "ssn 123-45-6789", "card 4111 1111 1111 1111",
                                  "$1,234.56", "555-1234", "555-123-45678", "id x5551234567", "time 1700000000",
                                  "1234567890", "192.168.100.200", "version 2.3.4", "(555)-1234", "(123)-456-7890",
                                  "(555)--123-4567", "(283)-182-38291"])
def test_mask_phone_numbers_leaves_look_alikes(text):
    assert mask_phone_numbers(text) == (text, 0)


@pytest.mark.parametrize("address", ["0.0.0.0", "10.0.0.1", "192.168.1.254", "255.255.255.255", "8.8.8.8"])
def test_mask_ip_addresses_replaces_valid_addresses(address):
    assert mask_ip_addresses(f"from {address}.") == (f"from {IP_PLACEHOLDER}.", 1)


@pytest.mark.parametrize("text", ["256.1.1.1", "999.1.1.1", "1.1.1.256", "version 1.2.3", "1.2.3.4.5", "v1.2.3.4",
                                  "01.2.3.4", "on 2024-01-15", "pi 3.14159", "$1.50"])
def test_mask_ip_addresses_leaves_out_of_range_octets_and_versions(text):
    assert mask_ip_addresses(text) == (text, 0)


def test_mask_functions_count_every_occurrence():
    text = "a@x.org, b@y.org and c@z.org; 555-123-4567 or (555) 765-4321; 10.0.0.1 10.0.0.2 10.0.0.3 10.0.0.4"
    assert mask_emails(text)[1] == 3
    assert mask_phone_numbers(text)[1] == 2
    assert mask_ip_addresses(text)[1] == 4


def test_pii_masker_masks_all_kinds_and_counts_them():
    masker = PIIMasker()
    documents = [Document(id="1", text="mail jo@example.com or call (555) 123-4567 from 192.168.0.1", metadata={"url": "u"}),
                 Document(id="2", text="nothing personal here"),
                 Document(id="3", text="a@b.co and c@d.co")]
    out = list(masker.run(documents))
    assert out[0].text == f"mail {EMAIL_PLACEHOLDER} or call {PHONE_PLACEHOLDER} from {IP_PLACEHOLDER}"
    assert out[0].metadata == {"url": "u"}
    assert out[1] is documents[1]
    assert masker.stats.changes == {"emails masked": 3, "phone numbers masked": 1, "IP addresses masked": 1,
                                    "documents masked": 2}


def test_pii_masker_masks_only_the_configured_kinds_with_custom_placeholders():
    masker = PIIMasker(PIIConfig(phone_numbers=False, email_placeholder="<EMAIL>"))
    [document] = masker.run([Document(id="1", text="jo@example.com 555-123-4567 8.8.8.8")])
    assert document.text == f"<EMAIL> 555-123-4567 {IP_PLACEHOLDER}"
    assert "phone numbers masked" not in masker.stats.changes


def test_pii_masker_masks_emails_before_their_digits_look_like_a_phone_number():
    [document] = PIIMasker().run([Document(id="1", text="5551234567@example.com")])
    assert document.text == EMAIL_PLACEHOLDER


def test_pii_config_rejects_an_empty_placeholder():
    with pytest.raises(GptlabError, match="ip_placeholder"):
        PIIConfig(ip_placeholder="")
