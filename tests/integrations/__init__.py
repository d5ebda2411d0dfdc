"""Tests of the reference integrations (the summarizer service, upstreams and demo)."""
