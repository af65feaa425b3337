"""Titan Text Embeddings v2 over Bedrock (``embedding.remote.TitanEmbedder``) with botocore's
Stubber: the request each text makes, vectors normalised whatever the service returns, throttling
retried, a refused request raised as it is."""
from __future__ import annotations

import io
import json

import boto3
import numpy as np
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from memstream.embedding.remote import TitanEmbedder


def client():
    c = boto3.client("bedrock-runtime", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    c.stub = Stubber(c)
    return c


def answer(vector: list[float]) -> dict:
    body = json.dumps({"embedding": vector, "inputTextTokenCount": 3}).encode()
    return {"body": io.BytesIO(body), "contentType": "application/json"}


def expected(text: str, dims: int = 256) -> dict:
    return {"modelId": "amazon.titan-embed-text-v2:0", "accept": "application/json", "contentType": "application/json",
            "body": json.dumps({"inputText": text, "dimensions": dims, "normalize": True})}


def test_each_text_is_one_call_and_its_vector_comes_back_normalised():
    c = client()
    e = TitanEmbedder(c, dimensions=256)
    c.stub.add_response("invoke_model", answer([3.0, 4.0] + [0.0] * 254), expected("I live in Lisbon."))
    c.stub.add_response("invoke_model", answer([0.0] * 255 + [2.0]), expected(" "))  # an empty text embeds as a space
    with c.stub:
        out = e.embed(["I live in Lisbon.", ""])
    assert out.shape == (2, 256) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0) and np.isclose(out[0, 0], 0.6)
    assert e.model_id == "bedrock:amazon.titan-embed-text-v2:0:256" and e.dim == 256
    assert e.embed([]).shape == (0, 256)


def test_throttling_is_retried_and_a_refused_request_is_raised_as_it_is():
    c = client()
    e = TitanEmbedder(c, dimensions=256, attempts=3)
    c.stub.add_client_error("invoke_model", "ThrottlingException", "slow down")
    c.stub.add_response("invoke_model", answer([1.0] * 256), expected("hi"))
    c.stub.add_client_error("invoke_model", "AccessDeniedException", "no access to the model")
    with c.stub:
        assert e.embed(["hi"]).shape == (1, 256)
        with pytest.raises(ClientError, match="AccessDenied"):
            e.embed(["hi"])


def test_throttling_past_the_attempts_and_a_dropped_connection_are_passing_not_fatal():
    from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

    from memstream.embedding.remote import EmbeddingUnavailable
    from memstream.streams.log.errors import Transient, as_retryable

    c = client()
    e = TitanEmbedder(c, dimensions=256, attempts=2)
    for _ in range(2):
        c.stub.add_client_error("invoke_model", "ThrottlingException", "slow down")
    with c.stub, pytest.raises(EmbeddingUnavailable, match="ThrottlingException after 2 attempts") as raised:
        e.embed(["hi"])
    assert isinstance(as_retryable(raised.value), Transient)  # the batch waits instead of the worker stopping
    assert TitanEmbedder._passing(ConnectionClosedError(endpoint_url="https://bedrock"))
    assert TitanEmbedder._passing(ReadTimeoutError(endpoint_url="https://bedrock"))


def test_only_the_dimensions_titan_v2_makes_are_taken():
    with pytest.raises(ValueError, match="256, 512, 1024"):
        TitanEmbedder(client(), dimensions=384)
