from flashgen.agent.extract import extract, fenced_blocks

TL = "Kernel attn\n  Copy Q from global to shared\n  Compute GEMM Q, K and get S\nend\n"
CU = 'extern "C" __global__ void k(const FlashgenAttnParams p) {}\n'


def test_picks_the_tagged_block_among_prose_and_other_blocks():
    reply = f"First the idea:\n```python\nprint(1)\n```\nThe program:\n```tl\n{TL}```\nand CUDA:\n```cuda\n{CU}```\nDone."
    assert extract(reply, "tl").code == TL
    assert extract(reply, "cuda").code == CU


def test_untagged_block_chosen_by_content():
    reply = f"```\n{CU}```\n\n```\n{TL}```"
    assert extract(reply, "tl").code == TL
    assert extract(reply, "cuda").code == CU


def test_longest_tagged_block_wins_over_a_fragment_repeated_after_it():
    fragment = "  Compute GEMM Q, K and get S\n  Copy Q from global to shared\n"
    reply = f"```tl\n{TL}```\nThe fix is this part:\n```tl\n{fragment}```"
    assert extract(reply, "tl").code == TL


def test_truncated_reply_is_flagged():
    reply = f"Here:\n```cuda\n{CU}// and then the reply was cut"
    found = extract(reply, "cuda")
    assert found is not None and found.truncated and "truncated" in found.note
    assert [b.terminated for b in fenced_blocks(reply)] == [False]


def test_nothing_usable():
    assert extract("I cannot help with that.", "tl") is None
    assert extract("```python\nprint(1)\n```", "cuda") is None


def test_unfenced_code_is_taken_whole():
    found = extract(TL, "tl")
    assert found is not None and found.code.strip() == TL.strip() and "no code fence" in found.note


def test_longer_fences_and_tildes():
    reply = f"~~~tl\n{TL}~~~\n````cuda\n```\n{CU}````\n"
    assert extract(reply, "tl").code == TL
    assert extract(reply, "cuda").code == "```\n" + CU
