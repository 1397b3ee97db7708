def test_guarded_count_matches_raw(analyst, raw):
    got = dict(analyst.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall())
    want = dict(raw.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall())
    assert got == want
