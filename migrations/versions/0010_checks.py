"""every video checked: a run's `checks.on_fail`, each video's check results (JSON text) and whether they flag it

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('checks_on_fail', sa.String(length=8), server_default='flag', nullable=False))
    with op.batch_alter_table('videos') as batch:
        batch.add_column(sa.Column('checks', sa.Text(), nullable=True))
        batch.add_column(sa.Column('flagged', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column('checks_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('videos') as batch:
        batch.drop_column('checks_s')
        batch.drop_column('flagged')
        batch.drop_column('checks')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('checks_on_fail')
