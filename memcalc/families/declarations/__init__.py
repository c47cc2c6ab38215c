"""One module per model family (or per generation of one), each defining DECLARATIONS: the
FamilyDeclaration records memcalc.families.registry lists (memcalc.families.declaration)."""
