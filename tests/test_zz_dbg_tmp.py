import duckdb
def test_x():
    print(duckdb.connect().execute("select now()").fetchall())
