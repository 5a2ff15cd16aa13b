"""Every setting of every command, declared once (:mod:`curvcal.settings.fields`): the click
options, the policy keys of ``check``, the report's ``settings`` record and the validation are
derived from the fields of these classes. Nothing here imports torch."""
