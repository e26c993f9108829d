#!/usr/bin/env python3
"""Checks the guide's relative links: every `[text](chapter.md#anchor)` names a chapter
that exists and a heading of it (mdBook's anchors: the heading in lower case, spaces as
`-`, punctuation dropped). mdBook itself does not check them. Usage: check-links.py guide/src
"""
import re, os, sys, glob, html
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'src')
def slugs_of(path):
    """The anchors of a chapter's headings."""
    out=set(); incode=False
    for line in open(path):
        if line.startswith("```"): incode = not incode; continue
        if incode: continue
        m = re.match(r'^(#+)\s+(.*)', line)
        if m:
            t = m.group(2).strip()
            t = re.sub(r'`', '', t)
            t = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', t)
            s = ''.join(c for c in t.lower() if c.isalnum() or c in ' -_')
            s = s.replace(' ', '-')
            out.add(s)
    return out
bad=0
for f in glob.glob(os.path.join(root, '*.md')):
    text=open(f).read()
    text=re.sub(r'```.*?```', '', text, flags=re.S)
    for m in re.finditer(r'\]\(([^)\s]+)\)', text):
        link=m.group(1)
        if link.startswith('http') : continue
        path, _, anchor = link.partition('#')
        target = os.path.join(root, path) if path else f
        if not os.path.exists(target):
            print(f"{f}: missing file {link}"); bad+=1; continue
        if anchor and target.endswith('.md') and anchor not in slugs_of(target):
            print(f"{f}: missing anchor {link}"); bad+=1
if bad:
    print(f"check-links.py: {bad} broken link(s)")
    sys.exit(1)
print("check-links.py: every relative link of the guide resolves")
