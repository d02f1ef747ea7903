"""The live page's HTML (jobs.service.page)."""

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>reelbatch</title></head>
<body><h1>reelbatch</h1></body></html>"""
