"""``headway check``: the endpoint contract check (seed 003's troubleshooting table, from the
boundary inward): what an OpenAI-compatible endpoint does with fixed inputs, recorded in a
contract file and compared against a reference endpoint or contract."""
