"""--msprobe-explore: search the inputs around a dumped call for one its kernel gets
wrong (`search`, hypothesis), over the inputs drawn near the dumped ones
(`neighbourhood`, with the ways it moves a tensor's values: `moves`), and what discards
an example found: the overflows no correct kernel of an API avoids (`overflow_excuses`)
and the rounding a correct kernel may reach (`rounding_excuses`; a recurrent layer's
gates written out cell by cell: `recurrent`).

May import: judge/verdict, judge/findings, judge/defects, judge/check.
"""
