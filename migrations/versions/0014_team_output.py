"""each team's output root: where its runs over the API may write (NULL: the service's output with the team's
name as a prefix; jobs.usecases.teams.output_root)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('teams') as batch:
        batch.add_column(sa.Column('output', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('teams') as batch:
        batch.drop_column('output')
