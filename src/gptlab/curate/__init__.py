"""Data curation: raw web pages to clean, deduplicated training text (readers, extraction, language, quality, PII,
deduplication), composed into `gptlab data curate`, whose output `gptlab data prepare` reads. No torch."""
